"""`c4 lab up`, `down`, `status`: the fabric, one aggregator, one agent per host, the pump.

`up` records each thing before or right as it makes it (state.json), and marks every process
with C4_LAB=<prefix>, so `down` removes everything even after `up` was killed half way.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from c4.core.topology import Topology

from . import cgroups, netns
from .fabric import Fabric
from .state import ROOT, LabError, LabState, check_prefix, lab_env, marked_pids
from .sysfs import make_tree

TOPOLOGIES = Path(__file__).resolve().parent / "topologies"
DEFAULT_TOPOLOGY = TOPOLOGIES / "default.json"
DEFAULT_COLLECTORS = ("host", "rdma", "nccl")
READY_TIMEOUT_S = 60.0
# The lab's links run at 100 Mbit/s, thousands of times slower than a 400G NIC: a connection
# moves a few MB per report interval, so the byte floors that keep a real job's idle
# connections out of the latency matrix are scaled down with it. Everything else is default.
LAB_DIAGNOSIS = """
[diagnosis]
min_cell_bytes = 131072
tcp_min_bytes = 131072
counter_min_rate = 2.0
"""

# C4P in the lab: plans go out on their own after a C4D link incident (and periodically when
# they gain enough); `c4 plan apply` pushes one by hand (with the lab's API token).
# `up(auto_apply=False)` keeps them proposals (bench/lab --no-auto-apply: C4D on a job whose
# connections stay where the lab put them).
LAB_PLANNING = """
[planning]
auto_apply = {auto_apply}
interval_s = 10.0
"""

Say = Callable[[str], None]


def shipped_topologies() -> dict[str, Path]:
    return {p.stem: p for p in sorted(TOPOLOGIES.glob("*.json"))}


def resolve_topology(spec: str | None) -> Path:
    """A file path, or the name of a shipped topology (`default`, `hosts16`, `rails2`)."""
    if not spec:
        return DEFAULT_TOPOLOGY
    shipped = shipped_topologies()
    if spec in shipped:
        return shipped[spec]
    p = Path(spec)
    if not p.exists():
        raise LabError(f"topology {spec!r}: no such file and not one of {', '.join(shipped)}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(st: LabState, name: str, argv: list[str], ns: str | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(st.dir / "logs" / f"{name}.log", "ab")
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env or lab_env(st.prefix), start_new_session=True,
                                preexec_fn=netns.enter_fn(ns) if ns else None)
    finally:
        log.close()


def c4_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "c4.cli", *args]


def _get(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def up(topology: str | None = None, prefix: str = "c4lab", collectors: tuple[str, ...] = DEFAULT_COLLECTORS,
       interval: float = 1.0, say: Say = lambda s: None, auto_apply: bool = True) -> LabState:
    check_prefix(prefix)
    src = resolve_topology(topology)
    topo = Topology.load(src)
    fab = Fabric(topo, prefix)
    d = LabState.path_for(prefix)
    if (d / "state.json").exists() or netns.listed(prefix):
        raise LabError(f"lab {prefix!r} exists (state in {d}); `c4 lab down --prefix {prefix}` "
                       "first, or pick another --prefix")
    t0 = time.monotonic()
    (d / "logs").mkdir(parents=True, exist_ok=True)
    st = LabState(d, {"prefix": prefix, "phase": "building", "topology_source": str(src),
                      "created": time.time(), "namespaces": [], "pids": {},
                      "collectors": list(collectors), "interval": interval, "next_fault": 1,
                      "faults": {}, "runs": {}})
    st.save()

    def created(ns: str) -> None:
        st.data["namespaces"].append(ns)
        st.save()

    def step(what: str) -> None:
        say(f"[{time.monotonic() - t0:5.1f}s] {what}")

    step(f"building {len(topo.hosts)} hosts, {len(topo.leaves)} leaves, {len(topo.spines)} "
         f"spines from {src}")
    fab.build(say=step, created=created)
    mapped = fab.path_map()
    mapped.save(d / "topology.json")
    step(f"path map: {len(mapped.paths)} paths (ECMP hash, seed {0xC4C4:#x})")

    for h, host in topo.hosts.items():
        hd = st.host_dir(h)
        make_tree(hd / "sys", fab.host_nics(h), {n.dev: n.gbps for n in host.nics})
        (hd / "run").mkdir(parents=True, exist_ok=True)
    groups = {h: cgroups.host_group(prefix, h) for h in topo.hosts}
    st.data["cgroups"] = {h: str(g) if g else None for h, g in groups.items()}
    step(f"RDMA sysfs trees and cgroups for {len(topo.hosts)} hosts")

    port = _free_port()
    ingest = f"ipc://{d}/ingest.sock"
    keys = d / "keys"
    _make_keys(keys, list(topo.hosts))
    (d / "aggregator.toml").write_text(
        f'name = "lab-{prefix}"\nlisten = "{ingest}"\napi = "127.0.0.1:{port}"\n'
        f'db = "{d}/c4.db"\ntopology = "{d}/topology.json"\n'
        f'server_secret_key = "{keys}/server.key_secret"\nenrolled_keys = "{keys}/enrolled"\n'
        f'api_token_file = "{_api_token(d)}"\n'
        f'{LAB_PLANNING.format(auto_apply=str(auto_apply).lower())}'
        f'{LAB_DIAGNOSIS}')
    st.data.update(api=f"http://127.0.0.1:{port}", ingest=ingest)
    agg = _spawn(st, "aggregator", c4_argv("aggregator", "run", "--config",
                                           str(d / "aggregator.toml")))
    st.data["pids"]["aggregator"] = agg.pid
    st.save()
    _wait(lambda: _get(st.api + "/healthz").get("ok"), "the aggregator API", agg)
    step(f"aggregator at {st.api} (ingest {ingest})")

    agents = {}
    for h in topo.hosts:
        cfg = _agent_config(st, h, ingest, interval, collectors, groups[h], fab)
        p = _spawn(st, f"agent-{h}", c4_argv("agent", "run", "--config", str(cfg)),
                   ns=fab.ns(h))
        agents[h] = p.pid
    st.data["pids"]["agents"] = agents
    pump = _spawn(st, "pump", [sys.executable, "-m", "c4.lab.sysfs", str(d)])
    st.data["pids"]["pump"] = pump.pid
    st.save()
    want = set(topo.hosts)
    _wait(lambda: want <= {x["name"] for x in _get(st.api + "/api/v1/hosts").get("hosts", [])},
          f"{len(want)} agents to say hello", agg)
    step(f"{len(agents)} agents reporting (collectors: {', '.join(collectors)})")
    st.data["phase"] = "up"
    st.data["ready_s"] = round(time.monotonic() - t0, 2)
    st.save()
    return st


def _agent_config(st: LabState, host: str, ingest: str, interval: float,
                  collectors: tuple[str, ...], group: Path | None, fab: Fabric) -> Path:
    hd = st.host_dir(host)
    rails = ", ".join(f'"{n.dev}" = {n.rail}' for n in fab.host_nics(host))
    keys = st.dir / "keys"
    text = (f'aggregator = "{ingest}"\ninterval = {interval}\nhost = "{host}"\n'
            f'server_public_key = "{keys}/server.key"\nsecret_key = "{keys}/{host}.key_secret"\n'
            f'sysfs_root = "{hd}/sys"\nrun_dir = "{hd}/run"\nresend_after = 2.0\n'
            f'labels = {{lab = "{st.prefix}"}}\n\n[collectors]\n'
            f'enabled = [{", ".join(json.dumps(c) for c in collectors)}]\n'
            f'[collectors.rdma]\nrails = {{{rails}}}\n')
    if "tcp_flows" in collectors:
        if group is None:
            raise LabError("tcp_flows in the lab needs cgroup v2 (per-host filtering)")
        text += f'[collectors.tcp_flows]\ncgroup = "{group}"\n'
    path = hd / "agent.toml"
    path.write_text(text)
    return path


def _api_token(d: Path) -> Path:
    """The bearer token of the lab aggregator's state-changing API (`c4 plan apply`):
    `api.token` in the state directory, 0600; `c4 lab` commands read it from there."""
    path = d / "api.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(24) + "\n")
    return path


def _make_keys(keys: Path, hosts: list[str]) -> None:
    """CURVE keys as an operator makes them with `c4 keys`: the aggregator's pair, one pair
    per host, each host's public key enrolled for that host name (the ZAP handler admits
    only those)."""
    from c4.core.keys import create_pair, enroll, load_public

    create_pair(keys, "server")
    for h in hosts:
        pub, _ = create_pair(keys, h)
        enroll(keys / "enrolled", h, load_public(pub))


def _wait(cond: Callable[[], Any], what: str, proc: subprocess.Popen[bytes] | None = None,
          timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LabError(f"waiting for {what}: process {proc.pid} exited ({proc.returncode}); "
                           "see the logs in the lab's state directory")
        try:
            if cond():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.2)
    raise LabError(f"timed out after {timeout:.0f} s waiting for {what} ({last})")


def stop_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGCONT (a hung rank cannot act on SIGTERM), SIGTERM, then SIGKILL after `grace`."""
    alive = []
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
        else:
            alive.append(pid)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def down(prefix: str = "c4lab", say: Say = lambda s: None) -> dict[str, int]:
    """Remove every process, namespace, cgroup and the state of lab `prefix`. Works from the
    state file, the C4_LAB marker and the name prefix, so it also cleans up after a crash."""
    check_prefix(prefix)
    d = LabState.path_for(prefix)
    pids = set(marked_pids(prefix))
    names = netns.listed(prefix)
    for ns in names:
        pids.update(netns.pids(ns))
    pids.discard(os.getpid())
    stop_pids(sorted(pids))
    say(f"stopped {len(pids)} processes")
    for ns in names:
        netns.remove(ns)
    say(f"removed {len(names)} namespaces")
    left = cgroups.remove_all(prefix)
    if d.exists():
        subprocess.run(["rm", "-rf", str(d)], check=False)
    say("removed cgroups and state" + (f" (left: {', '.join(left)})" if left else ""))
    return {"processes": len(pids), "namespaces": len(names), "cgroups_left": len(left)}


def status(prefix: str | None = None) -> list[dict[str, Any]]:
    """Every lab on the machine (or one): phase, size, processes alive, API, faults, runs."""
    prefixes = [prefix] if prefix else sorted(p.name for p in ROOT.glob("*")
                                              if (p / "state.json").exists())
    out = []
    for p in prefixes:
        try:
            st = LabState.open(p)
        except LabError:
            continue
        pids = st.data.get("pids", {})
        agents = pids.get("agents", {})
        entry: dict[str, Any] = {
            "prefix": p, "phase": st.data.get("phase"), "dir": str(st.dir), "api": st.api,
            "topology": st.data.get("topology_source"),
            "namespaces": len(netns.listed(p)),
            "aggregator_alive": _alive(pids.get("aggregator", 0)),
            "pump_alive": _alive(pids.get("pump", 0)),
            "agents": len(agents), "agents_alive": sum(_alive(x) for x in agents.values()),
            "faults_active": [f for f in st.data.get("faults", {}).values()
                              if f.get("healed") is None],
            "runs": st.data.get("runs", {}),
            "ready_s": st.data.get("ready_s"),
        }
        try:
            entry["incidents_open"] = len(_get(st.api + "/api/v1/incidents?state=open")
                                          .get("incidents", []))
        except Exception:
            entry["incidents_open"] = None
        out.append(entry)
    return out

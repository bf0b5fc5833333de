"""Starting and stopping the lab's workloads (`c4 lab run`, `c4 lab gloo`, `c4 lab stop`).

A run lives in `<state>/runs/<id>/` (config, per-rank logs, steps.jsonl, conns/, control.json)
and in state.json (`runs`: kind, job, rank -> host and pid), where faults find its ranks.
"""
from __future__ import annotations

import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable

from . import netns
from .control import stop_pids, _alive
from .fabric import LISTEN_PORT, Fabric, NicPlan
from .state import LabError, LabState, lab_env
from .workload import (RankSpec, RunConfig, conn_id, connections, read_steps, rank_env,
                       ring_orders, spawn_rank)


def placement(fab: Fabric, hosts: list[str] | None,
              ranks_per_host: int) -> list[tuple[str, str]]:
    """(host, leaf) in the order ranks are numbered: the topology's host order."""
    topo = fab.topology
    chosen = hosts or list(topo.hosts)
    unknown = [h for h in chosen if h not in topo.hosts]
    if unknown:
        raise LabError(f"unknown host(s) {', '.join(unknown)}")
    for h in chosen:
        if ranks_per_host > len(topo.hosts[h].nics):
            raise LabError(f"{h} has {len(topo.hosts[h].nics)} NIC(s): at most that many "
                           "ranks per host (one per rail)")
    return [(h, topo.host_leaf(h) or "") for h in chosen]


def _spine_on(path: list[str] | None, fab: Fabric) -> str | None:
    for link in path or ():
        for s in fab.topology.spines:
            if link.endswith("-" + s):
                return s
    return None


def new_run(st: LabState, kind: str) -> tuple[str, Path]:
    with st.locked():
        n = int(st.data.get("next_run", 1))
        st.data["next_run"] = n + 1
    run_id = f"{kind}{n}"
    d = st.dir / "runs" / run_id
    d.mkdir(parents=True)
    return run_id, d


def start_ring(st: LabState, *, steps: int, payload: int, compute_ms: float, channels: int,
               buckets: int = 4, ranks_per_host: int = 1, hosts: list[str] | None = None,
               job: str | None = None, say: Callable[[str], None] = lambda s: None) -> str:
    fab = st.fabric()
    topo = fab.topology
    order = placement(fab, hosts, ranks_per_host)
    if len(order) * ranks_per_host < 2:
        raise LabError("a ring needs at least 2 ranks")
    run_id, d = new_run(st, "ring")
    ranks: list[RankSpec] = []
    nics: list[NicPlan] = []
    local: dict[int, int] = {}  # rank -> its index on its host (its NIC: one rank per rail)
    for h, _ in order:
        hn = fab.host_nics(h)
        for i in range(ranks_per_host):
            nic = hn[i]
            local[len(ranks)] = i
            ranks.append(RankSpec(len(ranks), h, nic.addr, LISTEN_PORT + i, nic.dev))
            nics.append(nic)
    rings = ring_orders(order, ranks_per_host, channels)
    cfg = RunConfig(run_id=run_id, job=job or f"lab-{run_id}",
                    comm_id=zlib.crc32(f"{st.prefix}/{run_id}".encode()) | (0xC4 << 32),
                    ranks=ranks, rings=rings, sports={}, payload=payload, steps=steps,
                    compute_ms=compute_ms, nnodes=len(order), buckets=buckets)
    used: dict[str, set[int]] = {}
    for r in ranks:
        for c in range(channels):
            nxt = ranks[cfg.neighbours(r.rank, c)[1]]
            a, b = nics[r.rank], nics[nxt.rank]
            spine = _spine_on(topo.path(a.host, b.host, a.dev, b.dev), fab)
            avoid = used.setdefault(r.host, set())
            sport = fab.pick_sport(a, b, nxt.port, spine, avoid, conn_id(r.rank, c))
            avoid.add(sport)
            cfg.sports[conn_id(r.rank, c)] = sport
    cfg.save(d / "config.json")
    env = lab_env(st.prefix)
    pids = {}
    for r in ranks:
        hd = st.host_dir(r.host)
        p = spawn_rank([sys.executable, "-m", "c4.lab.workload", "rank", str(d), str(r.rank)],
                       rank_env(env, hd / "run" / "plugin.sock", cfg.job,
                                local[r.rank]),
                       netns.enter_fn(fab.ns(r.host)), st.data.get("cgroups", {}).get(r.host),
                       d / f"rank{r.rank}.log")
        pids[r.rank] = p.pid
    with st.locked():
        st.data["runs"][run_id] = {
            "kind": "ring", "job": cfg.job, "dir": str(d), "state": "running",
            "pids": {str(k): v for k, v in pids.items()},
            "hosts": {str(r.rank): r.host for r in ranks}, "started": time.time(),
            "payload": payload, "channels": channels, "nranks": len(ranks)}
    say(f"run {run_id}: {len(ranks)} ranks on {len(order)} hosts, {channels} channel(s), "
        f"{payload} B per step in {buckets} AllReduce(s), compute {compute_ms} ms, job {cfg.job}")
    return run_id


def run_info(st: LabState, run_id: str | None) -> tuple[str, dict[str, Any]]:
    runs = st.data.get("runs", {})
    if run_id is None:
        live = [k for k, v in runs.items() if v.get("state") == "running"]
        if not live:
            raise LabError("no workload is running (`c4 lab run --detach`)")
        run_id = live[-1]
    if run_id not in runs:
        raise LabError(f"no run {run_id!r}; runs: {', '.join(runs) or 'none'}")
    return run_id, runs[run_id]


def alive_ranks(info: dict[str, Any]) -> dict[int, int]:
    return {int(r): p for r, p in info.get("pids", {}).items() if _alive(p)}


def wait_steps(run_dir: Path, n: int, timeout: float, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Wait until the run logged `n` steps; fail early when a rank died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [s for s in read_steps(run_dir) if "step" in s]
        if len(steps) >= n:
            return steps
        if len(alive_ranks(info)) < len(info.get("pids", {})) and not _done(run_dir):
            dead = sorted(set(map(int, info["pids"])) - set(alive_ranks(info)))
            log = (run_dir / f"rank{dead[0]}.log")
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            raise LabError(f"rank(s) {dead} exited before step {n}:\n{tail}")
        time.sleep(0.1)
    raise LabError(f"no {n} steps after {timeout:.0f} s (see {run_dir}/rank*.log)")


def _done(run_dir: Path) -> bool:
    return any("done" in s for s in read_steps(run_dir))


def stop_run(st: LabState, run_id: str | None) -> list[str]:
    """Stop one run (or every running one); returns the ids stopped."""
    ids = [run_id] if run_id else [k for k, v in st.data.get("runs", {}).items()
                                   if v.get("state") == "running"]
    for rid in ids:
        _, info = run_info(st, rid)
        stop_pids(list(info.get("pids", {}).values()) + list(info.get("extra_pids", [])))
    with st.locked():
        for rid in ids:
            st.data["runs"][rid]["state"] = "stopped"
            st.data["runs"][rid]["stopped"] = time.time()
    return ids


def finish(st: LabState, run_id: str) -> None:
    with st.locked():
        st.data["runs"][run_id]["state"] = "finished"


def conn_spines(fab: Fabric, run_dir: Path) -> dict[str, str | None]:
    """Connection id -> the spine the fabric's ECMP sends its live 5-tuple over (the kernel's
    own answer for the leaf's multipath route): where the connection runs now, on its
    planned port after a C4P plan."""
    out = {}
    for c in connections(run_dir):
        src, dst = fab.nic_of_addr(c["saddr"]), fab.nic_of_addr(c["daddr"])
        if src is None or dst is None:
            raise LabError(f"connection {c['id']}: {c['saddr']} -> {c['daddr']} is not the lab's")
        out[c["id"]] = fab.spine_of(src, dst, c["sport"], c["dport"])
    return out


def link_load(st: LabState, run_id: str) -> dict[str, list[str]]:
    """Fabric link -> the run's connections that cross it now (their live 5-tuples as the
    kernel routes them: after a C4P plan, the planned ports' spines, not the lab's default
    path map), busiest first: where a link fault touches the job most."""
    _, info = run_info(st, run_id)
    fab = st.fabric()
    conns = connections(info["dir"])
    if not conns:
        raise LabError(f"run {run_id} has made no connection yet")
    out: dict[str, list[str]] = {}
    for c, spine in zip(conns, conn_spines(fab, Path(info["dir"])).values()):
        src, dst = fab.nic_of_addr(c["saddr"]), fab.nic_of_addr(c["daddr"])
        assert src is not None and dst is not None  # conn_spines checked
        for link in fab.path(src, dst, spine):
            if fab.topology.links[link].kind == "fabric":
                out.setdefault(link, []).append(c["id"])
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def singled_out(st: LabState, run_id: str, load: dict[str, list[str]]) -> set[str]:
    """The fabric links of `load` (link_load) the job's traffic can single out: the
    connections that reach the link's leaf through it come from two other leaves or more. A
    link down blackholes only that direction (its leaf drops the dead nexthop at once: its
    own traffic leaves by the other spines), and connections of one leaf pair cross both ends
    of their path, so no end-to-end observer tells those two links apart (measured: downs and
    flaps on links only leaf03 -> leaf02, leaf00 <-> leaf01 or leaf01 <-> leaf02 connections
    crossed, and a flap on a link one connection crossed, were named by nothing, or by the
    other end; probes separate them, slowly)."""
    _, info = run_info(st, run_id)
    fab = st.fabric()
    leaves: dict[str, tuple[str, str]] = {}  # connection id -> (source leaf, destination leaf)
    for c in connections(info["dir"]):
        src, dst = fab.nic_of_addr(c["saddr"]), fab.nic_of_addr(c["daddr"])
        if src is not None and dst is not None:
            leaves[c["id"]] = (src.leaf, dst.leaf)
    out = set()
    for lk, conns in load.items():
        leaf = lk.rsplit("-", 1)[0]  # leafL-spineS
        if len({leaves[c][0] for c in conns if c in leaves and leaves[c][1] == leaf}) >= 2:
            out.add(lk)
    return out


def start_gloo(st: LabState, *, steps: int, width: int = 512, batch: int = 32,
               hosts: list[str] | None = None, job: str | None = None,
               say: Callable[[str], None] = lambda s: None) -> str:
    """The PyTorch DDP (gloo) job, one rank per host on its first NIC (lab/gloo.py)."""
    import json

    try:
        import torch  # noqa: F401  (only to fail early and clearly)
    except ImportError:
        raise LabError("the gloo job needs PyTorch: pip install -e '.[lab]' "
                       "(scripts/setup.sh does)") from None
    fab = st.fabric()
    order = placement(fab, hosts, 1)
    run_id, d = new_run(st, "gloo")
    ranks = []
    for h, _ in order:
        nic = fab.host_nics(h)[0]
        ranks.append({"rank": len(ranks), "host": h, "addr": nic.addr, "netdev": nic.netdev})
    job = job or f"lab-{run_id}"
    (d / "config.json").write_text(json.dumps({"ranks": ranks, "steps": steps, "width": width,
                                               "batch": batch, "job": job}))
    env = lab_env(st.prefix)
    env.update(C4_JOB_ID=job, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    pids = {}
    for r in ranks:
        p = spawn_rank([sys.executable, "-m", "c4.lab.gloo", str(d), str(r["rank"])], env,
                       netns.enter_fn(fab.ns(r["host"])), st.data.get("cgroups", {}).get(r["host"]),
                       d / f"rank{r['rank']}.log")
        pids[r["rank"]] = p.pid
    with st.locked():
        st.data["runs"][run_id] = {
            "kind": "gloo", "job": job, "dir": str(d), "state": "running",
            "pids": {str(k): v for k, v in pids.items()},
            "hosts": {str(r["rank"]): r["host"] for r in ranks}, "started": time.time(),
            "nranks": len(ranks)}
    say(f"run {run_id}: PyTorch DDP (gloo) on {len(ranks)} hosts, MLP width {width}, batch "
        f"{batch}, job {job}; c4 sees it through eBPF only")
    return run_id

"""`c4 lab inject KIND TARGET`, `c4 lab heal [ID]`, `c4 lab faults`: real faults on the lab.

| kind | target | how | heal |
|---|---|---|---|
| loss | link | nftables `numgen random` drop on the receiving end's ingress (netdev hook), `percent`, `direction` ab/ba/both | delete the table |
| slow | link | tbf at `mbit` on both ends' egress | the topology's rate (or no qdisc) |
| down | link | both ends admin down; the routes withdrawn fabric-wide `converge_s` later | up, routes back |
| flap | link | a process taking it down `down_s` and up `up_s`, repeatedly (withdrawn after `converge_s`) | stop it, up, routes back |
| nicdown | host or host/dev | the host end of the NIC's cable down (the port's carrier goes, its routes go) | up, routes back |
| hang | rank or host | SIGSTOP the rank(s) of the running job | SIGCONT |
| straggler | rank or host | the rank(s) into a cgroup limited to `cpu` % of a CPU (default 2) | back out |

A link is a topology link id: `leaf01-spine00` (fabric) or `node003/mlx5_0-leaf01` (access);
`ab` is the direction from the link's `a` end (host NIC / leaf) to its `b` end (leaf / spine).
A link that fails is not avoided at once: its two ends stop using it (the kernel drops the
dead nexthop: carrier loss is local knowledge), but every other router keeps hashing traffic
onto paths through it until the routing protocol withdraws them (`converge_s`, default 3 s:
BGP with BFD takes hundreds of ms to seconds): meanwhile the spine drops what other leaves
still send it for the far leaf. Then the routes are withdrawn fabric-wide.

Every injection and heal is appended to `faults.jsonl` with its wall-clock time and the
component C4D should name (`expect`): the ground truth tests and benchmarks score against.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from c4.core.topology import endpoint

from . import cgroups, netns
from .control import stop_pids
from .fabric import Fabric, Wire, clear_rate, set_rate
from .runs import alive_ranks, run_info
from .state import LabError, LabState, lab_env

CONVERGE_S = 3.0  # a failed link's routes are withdrawn fabric-wide this long after it fails
KINDS = ("loss", "slow", "down", "flap", "nicdown", "hang", "straggler")
LINK_KINDS = ("loss", "slow", "down", "flap")
DEFAULTS: dict[str, dict[str, Any]] = {
    "loss": {"percent": 5.0, "direction": "both"},
    "slow": {"mbit": 10.0},
    "down": {"converge_s": CONVERGE_S},
    "flap": {"down_s": 1.0, "up_s": 3.0, "converge_s": CONVERGE_S},
    "straggler": {"cpu": 2.0},
}


def parse_params(kind: str, items: list[str]) -> dict[str, Any]:
    params = dict(DEFAULTS.get(kind, {}))
    for item in items:
        key, _, value = item.partition("=")
        if key not in params:
            known = ", ".join(params) or "none"
            raise LabError(f"{kind}: unknown parameter {key!r} (known: {known})")
        if key == "direction":
            if value not in ("ab", "ba", "both"):
                raise LabError("direction: ab, ba or both")
            params[key] = value
        else:
            try:
                params[key] = float(value)
            except ValueError:
                raise LabError(f"{key}={value!r}: expected a number") from None
    if kind == "loss" and not 0 < params["percent"] <= 100:
        raise LabError("percent: between 0 and 100")
    if kind == "slow" and params["mbit"] <= 0:
        raise LabError("mbit: must be positive")
    if params.get("converge_s", 0.0) < 0:
        raise LabError("converge_s: must not be negative")
    if kind == "straggler" and not 1 <= params["cpu"] <= 100:
        raise LabError("cpu: between 1 and 100 (% of one CPU)")
    return params


# ----------------------------------------------------------------------------- targets


def _wire(fab: Fabric, target: str) -> Wire:
    w = fab.wires.get(target)
    if w is None:
        fabric = sorted(k for k, v in fab.wires.items() if v.kind == "fabric")
        raise LabError(f"no link {target!r}; fabric links: {', '.join(fabric)}; access links "
                       "look like node000/mlx5_0-leaf00")
    return w


def _nic_wire(fab: Fabric, target: str) -> Wire:
    host, _, dev = target.partition("/")
    nics = fab.host_nics(host)
    if not nics:
        raise LabError(f"no host {host!r}")
    nic = next((n for n in nics if n.dev == dev), None) if dev else nics[0]
    if nic is None:
        raise LabError(f"{host} has no NIC {dev!r}")
    return fab.wires[f"{endpoint(nic.host, nic.dev)}-{nic.leaf}"]


def _ranks(st: LabState, target: str, run: str | None) -> tuple[str, dict[int, int], dict[int, str]]:
    rid, info = run_info(st, run)
    alive = alive_ranks(info)
    hosts = {int(r): h for r, h in info.get("hosts", {}).items()}
    t = target.removeprefix("rank")
    if t.isdigit():
        chosen = [int(t)]
    else:
        chosen = [r for r, h in hosts.items() if h == target]
    if not chosen or any(r not in hosts for r in chosen):
        raise LabError(f"run {rid} has no rank or host {target!r} (ranks: "
                       f"{', '.join(f'{r}@{h}' for r, h in sorted(hosts.items()))})")
    pids = {r: alive[r] for r in chosen if r in alive}
    if not pids:
        raise LabError(f"run {rid}: rank(s) {chosen} are not running")
    return rid, pids, {r: hosts[r] for r in chosen}


def _expect_link(fab: Fabric, w: Wire) -> dict[str, Any]:
    """What C4D should name for a fault on this link: the fabric link, or for an access link
    its NIC (for a one-NIC host C4D says the host: NIC and host cover the same connections)."""
    if w.kind == "fabric":
        return {"kind": "link", "id": w.link, "accept": [w.link]}
    nic = next(n for n in fab.nics.values() if f"{endpoint(n.host, n.dev)}-{n.leaf}" == w.link)
    ep = endpoint(nic.host, nic.dev)
    return {"kind": "nic", "id": ep, "host": nic.host, "accept": [ep, nic.host, w.link]}


# ----------------------------------------------------------------------------- actions


def _nft_table(fid: int, end: str) -> str:
    return f"c4lab_f{fid}{end}"


def _loss(fab: Fabric, w: Wire, fid: int, percent: float, direction: str) -> list[dict[str, str]]:
    ends = {"ab": [("b", w.b)], "ba": [("a", w.a)], "both": [("b", w.b), ("a", w.a)]}[direction]
    tables = []
    for tag, end in ends:
        name = _nft_table(fid, tag)
        rules = (f"table netdev {name} {{\n chain ingress {{\n"
                 f"  type filter hook ingress device \"{end.ifname}\" priority 0;\n"
                 f"  meta protocol ip numgen random mod 10000 < {round(percent * 100)} "
                 f"counter drop\n }}\n}}\n")
        netns.run(end.ns, "nft", "-f", "-", input=rules)
        tables.append({"ns": end.ns, "table": name})
    return tables


def _set_state(w: Wire, up: bool, ends: str = "ab") -> None:
    for end in ([w.a] if "a" in ends else []) + ([w.b] if "b" in ends else []):
        with netns.open_ns(end.ns) as ipr:
            idx = ipr.link_lookup(ifname=end.ifname)
            if idx:
                ipr.link("set", index=idx[0], state="up" if up else "down")


def down_links(st: LabState, fab: Fabric) -> set[str]:
    """Links held down by active faults (down, nicdown, a flap in its down phase)."""
    out = set()
    for f in st.data.get("faults", {}).values():
        if f.get("healed") is None and f["kind"] in ("down", "nicdown"):
            out.add(f["link"])
    flaps = st.dir / "flapping"
    if flaps.exists():
        out |= {p.read_text().strip() for p in flaps.glob("*") if p.is_file()}
    return out & set(fab.wires)


def inject(st: LabState, kind: str, target: str, params: dict[str, Any],
           run: str | None = None) -> dict[str, Any]:
    if kind not in KINDS:
        raise LabError(f"unknown fault kind {kind!r}; kinds: {', '.join(KINDS)}")
    params = {**DEFAULTS.get(kind, {}), **params}  # callers may name only what they change
    fab = st.fabric()
    with st.locked():
        fid = int(st.data.get("next_fault", 1))
        st.data["next_fault"] = fid + 1
        f: dict[str, Any] = {"id": fid, "kind": kind, "target": target, "params": params}
        if kind in LINK_KINDS:
            w = _wire(fab, target)
            f.update(link=w.link, expect=_expect_link(fab, w))
            if kind == "loss":
                f["nft"] = _loss(fab, w, fid, params["percent"], params["direction"])
            elif kind == "slow":
                for end in (w.a, w.b):
                    with netns.open_ns(end.ns) as ipr:
                        set_rate(ipr, ipr.link_lookup(ifname=end.ifname)[0], params["mbit"])
            elif kind == "down":
                _set_state(w, False)
                if params["converge_s"] > 0:  # withdrawn later, by a process `down` finds
                    f["pid"] = _spawn(st, fid, ["converge", str(st.dir), str(fid),
                                                str(params["converge_s"])])
                else:
                    st.data["faults"][str(fid)] = f  # counted in down_links below
                    fab.sync_routes(down_links(st, fab))
            elif kind == "flap":
                f["pid"] = _spawn(st, fid, ["flap", str(st.dir), str(fid), w.link,
                                            str(params["down_s"]), str(params["up_s"]),
                                            str(params["converge_s"])])
        elif kind == "nicdown":
            w = _nic_wire(fab, target)
            f.update(link=w.link, expect=_expect_link(fab, w))
            f["expect"]["kind"] = "nic"
            _set_state(w, False, "a")
            st.data["faults"][str(fid)] = f
            fab.sync_routes(down_links(st, fab))
        else:
            rid, pids, hosts = _ranks(st, target, run)
            rank = min(pids)
            f.update(run=rid, pids={str(r): p for r, p in pids.items()})
            if kind == "hang":
                f["expect"] = {"kind": "host", "id": hosts[rank], "host": hosts[rank],
                               "rank": rank, "accept": [hosts[rank]]}
                for pid in pids.values():
                    os.kill(pid, signal.SIGSTOP)
            else:
                group = cgroups.starve(st.prefix, f"f{fid}", list(pids.values()), params["cpu"])
                f.update(cgroup=str(group), expect={"kind": "rank", "id": str(rank),
                                                    "host": hosts[rank], "rank": rank,
                                                    "accept": [str(rank), hosts[rank]]})
        f["injected"] = time.time()
        f["healed"] = None
        st.data["faults"][str(fid)] = f
        st.log_fault({"event": "inject", **f})
    return f


def heal(st: LabState, fid: int | None = None) -> list[dict[str, Any]]:
    """Undo one active fault, or all of them."""
    fab = st.fabric()
    healed = []
    with st.locked():
        active = {int(k): f for k, f in st.data.get("faults", {}).items() if f.get("healed") is None}
        if fid is not None and fid not in active:
            raise LabError(f"no active fault {fid}; active: {', '.join(map(str, active)) or 'none'}")
        reroute = False
        for i in sorted([fid] if fid is not None else active):
            f = active[i]
            kind = f["kind"]
            if kind == "loss":
                for t in f.get("nft", []):
                    try:
                        netns.run(t["ns"], "nft", "delete", "table", "netdev", t["table"])
                    except RuntimeError:
                        pass  # the namespace or table is gone already
            elif kind == "slow":
                w = fab.wires[f["link"]]
                for end in (w.a, w.b):
                    with netns.open_ns(end.ns) as ipr:
                        idx = ipr.link_lookup(ifname=end.ifname)[0]
                        if w.mbit is not None:
                            set_rate(ipr, idx, w.mbit)
                        else:
                            clear_rate(ipr, idx)
            elif kind in ("down", "nicdown", "flap"):
                if f.get("pid"):  # the flapping, or the withdrawal still to come
                    stop_pids([f["pid"]])
                    (st.dir / "flapping" / str(i)).unlink(missing_ok=True)
                _set_state(fab.wires[f["link"]], True, "a" if kind == "nicdown" else "ab")
                reroute = True
            elif kind == "hang":
                for pid in f["pids"].values():
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            elif kind == "straggler":
                cgroups.release(Path(f["cgroup"]), list(f["pids"].values()))
            f["healed"] = time.time()
            st.data["faults"][str(i)] = f
            st.log_fault({"event": "heal", "id": i, "kind": kind, "target": f["target"],
                          "healed": f["healed"]})
            healed.append(f)
        if reroute:
            fab.sync_routes(down_links(st, fab))
    return healed


def faults(st: LabState) -> list[dict[str, Any]]:
    return sorted(st.data.get("faults", {}).values(), key=lambda f: f["id"])


def _spawn(st: LabState, fid: int, args: list[str]) -> int:
    with open(st.dir / "logs" / f"fault{fid}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "c4.lab.faults", *args],
                                env=lab_env(st.prefix), start_new_session=True, stdout=log,
                                stderr=log).pid


def converge(state_dir: Path, fid: int, delay: float) -> None:
    """The process that withdraws a downed link's routes fabric-wide after `delay` (unless
    the fault was healed meanwhile: then the routes are already right)."""
    time.sleep(delay)
    st = LabState.open_dir(state_dir)
    with st.locked():
        if st.data.get("faults", {}).get(str(fid), {}).get("healed") is None:
            fab = st.fabric()
            fab.sync_routes(down_links(st, fab))


def flap(state_dir: Path, fid: int, link: str, down_s: float, up_s: float,
         converge_s: float) -> None:
    """The flapping process: down and up again until SIGTERM; the routes are withdrawn
    `converge_s` into a down phase (never, when it is shorter) and restored on up."""
    st = LabState.open_dir(state_dir)
    fab = st.fabric()
    w = fab.wires[link]
    mark = state_dir / "flapping" / str(fid)
    mark.parent.mkdir(exist_ok=True)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ends = "a" if w.kind == "access" else "ab"  # a NIC port flaps; a fabric cable at both ends

    def reroute() -> None:
        st.data = json.loads((state_dir / "state.json").read_text())
        fab.sync_routes(down_links(st, fab))

    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not stop and time.monotonic() < end:
            time.sleep(0.05)

    def phase(what: str) -> None:
        # each transition with its wall-clock time, in the fault's log: what the fault did,
        # where the truth file only says when it began and ended
        print(json.dumps({"t": round(time.time(), 3), "link": link, "phase": what}), flush=True)

    while not stop:
        _set_state(w, False, ends)
        phase("down")
        withdrawn = converge_s < down_s
        if withdrawn:
            sleep(converge_s)
            mark.write_text(link)
            reroute()
        # the rest of the down phase (all of it where the routes stay: until 2026-12-07 this
        # slept 0 s then, and the lab's 1 s flaps were down 30-40 ms)
        sleep(down_s - (converge_s if withdrawn else 0.0))
        mark.unlink(missing_ok=True)
        _set_state(w, True, ends)
        phase("up")
        reroute()  # admin down flushed the routes through it, withdrawn or not
        phase("rerouted")
        sleep(up_s)
    mark.unlink(missing_ok=True)


if __name__ == "__main__":
    a = sys.argv[2:]
    if sys.argv[1:2] == ["flap"]:
        flap(Path(a[0]), int(a[1]), a[2], float(a[3]), float(a[4]), float(a[5]))
    elif sys.argv[1:2] == ["converge"]:
        converge(Path(a[0]), int(a[1]), float(a[2]))

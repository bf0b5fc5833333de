"""C4D places each connection on the path its own source port takes (model.route): after C4P
applies a plan, the lab's ring runs on planned ports, on other spines than the NIC pair's
default path in the topology. Found in the lab: C4D voted on the default paths and missed or
misnamed the link faults after a re-plan.

The recording is the real lab's (tests/fixtures/lab: the ring on the default 8-host fabric,
leaf01-spine01 flapping 1 s down / 3 s up, agents with eBPF tcp_flows). Its topology here
swaps the two spines in every path, as if every connection had been moved to the other spine
by a plan, and the aggregator's own C4P path map knows where each connection's port really
runs (the recorded fabric's path), as probes of the planned ports teach it."""
from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.replay import Replay
from c4.aggregator.server import Core, build_core
from c4.core import record, wire
from c4.core.topology import Topology, endpoint

LAB = Path(__file__).resolve().parents[1] / "fixtures" / "lab"
FAULT = "leaf01-spine01"


def swapped(topo: Topology) -> Topology:
    """The topology with spine00 and spine01 exchanged in every path."""
    out = Topology.from_dict(topo.to_dict())
    swap = {"spine00": "spine01", "spine01": "spine00"}
    for pair, links in topo.paths.items():
        out.paths[pair] = ["-".join(swap.get(p, p) for p in lk.split("-")) for lk in links]
    return out


def bulk_socks(rec: Path) -> set[tuple[str, int, str, int]]:
    """The ring's data connections in the recording (saddr, sport, daddr, dport)."""
    out = set()
    for data in record.read(rec):
        f = wire.decode(data)
        for fl in ((f.body.get("tcp_flows") or {}).get("flows") or ()) if f.kind == "report" \
                else ():
            if fl["bytes_acked_delta"] >= 131072:
                out.add((fl["saddr"], fl["sport"], fl["daddr"], fl["dport"]))
    return out


def replay(rec: Path, truth: dict[str, Any], topo: Topology, real: Topology | None) -> Core:
    """Replay through ingest, diagnosis and C4P; `real`: C4P's map learns where each data
    connection's port runs on the recorded fabric, before the fault."""
    r = Replay(cfg=AggregatorConfig(diagnosis=truth["diagnosis"]), topology=topo)
    if real is not None:
        assert r.core.planner is not None
        for saddr, sport, daddr, dport in bulk_socks(rec):
            (sh, sn), (dh, dn) = real.nic_by_addr(saddr), real.nic_by_addr(daddr)
            src, dst = endpoint(sh, sn.dev), endpoint(dh, dn.dev)
            r.core.planner.pathmap.learn(src, dst, f"tcp:{dport}", sport,
                                         tuple(real.paths[(src, dst)]), truth["epoch"])
    r.feed(rec)
    r.finish()
    return r.core


def named(core: Core) -> list[str]:
    return [i["suspects"][0]["id"] for i in core.diagnosis.incidents(None) if i["localised"]]


def unpack(tmp: Path) -> tuple[Path, dict[str, Any], Topology]:
    rec = tmp / "flap.c4rec"
    rec.write_bytes(lzma.decompress((LAB / "02-flap-leaf01-spine01.c4rec.xz").read_bytes()))
    truth = json.loads((LAB / "02-flap-leaf01-spine01.c4rec.truth.json").read_text())
    return rec, truth, Topology.load(LAB / "topology.json")


def test_a_planned_ports_link_fault_is_named_on_the_path_the_port_takes(tmp_path: Path) -> None:
    rec, truth, real = unpack(tmp_path)
    core = replay(rec, truth, swapped(real), real)
    assert named(core) == [FAULT], core.diagnosis.incidents(None)
    (inc,) = core.diagnosis.incidents(None)
    assert inc["evidence"]["retransmitting_flows"]
    assert not any("spine00" in s["id"] for s in inc["suspects"])
    # the ring's plugin connections are placed on their sockets' paths too
    model = core.diagnosis.model
    placed = [(c, model.components(c_, c)) for c_ in model.comms.values()
              for c in c_.cells.values()]
    assert placed and all(p is not None for _, p in placed)
    crossing = [c for c, comps in placed if any(x[1] == FAULT for x in comps)]
    assert crossing and all("leaf01-spine00" not in c.path for c in crossing)


def test_without_the_ports_paths_the_default_paths_misplace_it(tmp_path: Path) -> None:
    """The premise: C4P's map without the planned ports, C4D has only the topology's (here
    wrong) default paths, and does not name the link (what the lab showed after re-plans)."""
    rec, truth, real = unpack(tmp_path)
    assert FAULT not in named(replay(rec, truth, swapped(real), None))


def sock(saddr: str, sport: int, daddr: str, dport: int, pid: int, acked: int,
         closed: bool = False) -> dict[str, Any]:
    return {"saddr": saddr, "sport": sport, "daddr": daddr, "dport": dport, "pid": pid,
            "bytes_acked_delta": acked, "closed": closed}


def test_a_ranks_connection_follows_its_socket_to_a_new_port_at_once() -> None:
    """model.components for a plugin connection: the socket rank 0's process sends on to
    rank 1's host and rank 1's process accepted (not the one another rank there accepted);
    its port's path as soon as C4P learns it; a reconnect on a port C4P does not know goes
    back to the NIC pair's path."""
    from c4.aggregator.diagnosis.model import Cell, Comm, Rank

    topo = Topology.load(LAB / "topology.json")
    core = build_core(AggregatorConfig(), db_path=":memory:", topology=topo)
    model, planner = core.diagnosis.model, core.planner
    src, dst = "node000/mlx5_0", "node002/mlx5_0"
    default = topo.paths[(src, dst)]
    other = swapped(topo).paths[(src, dst)]
    assert "leaf00-spine01" in default and "leaf00-spine00" in other
    comm = Comm("c", "job", 3, 0.0)
    for r, host, pid in ((0, "node000", 100), (1, "node002", 200), (2, "node002", 300)):
        rk = comm.ranks[r] = Rank(r, host)
        rk.pid, rk.nic = pid, f"{host}/mlx5_0"
    model.on_socks("node000", {"flows": [
        sock("10.0.0.10", 40000, "10.0.1.10", 30000, 100, 1 << 20),
        sock("10.0.0.10", 40002, "10.0.1.10", 30001, 100, 1 << 20)]}, 131072)
    model.on_socks("node002", {"flows": [
        sock("10.0.1.10", 30000, "10.0.0.10", 40000, 200, 0),
        sock("10.0.1.10", 30001, "10.0.0.10", 40002, 300, 0)]}, 131072)
    cell = Cell(0, 1)
    model.now = 10.0
    model.components(comm, cell)
    assert cell.path == default
    planner.pathmap.learn(src, dst, "tcp:30000", 40000, tuple(other), 10.0)
    planner.pathmap.learn(src, dst, "tcp:30001", 40002, tuple(default), 10.0)
    comps = model.components(comm, cell)
    assert cell.path == other  # the same instant: the new path is not waited for
    links = {c[1] for c in comps if c[0] == "link"}
    assert "leaf00-spine00" in links and "leaf00-spine01" not in links
    model.on_socks("node000", {"flows": [
        sock("10.0.0.10", 40000, "10.0.1.10", 30000, 100, 0, closed=True),
        sock("10.0.0.10", 40004, "10.0.1.10", 30000, 100, 1 << 20)]}, 131072)
    model.on_socks("node002", {"flows": [
        sock("10.0.1.10", 30000, "10.0.0.10", 40000, 200, 0, closed=True),
        sock("10.0.1.10", 30000, "10.0.0.10", 40004, 200, 0)]}, 131072)
    assert model.rank_socks(comm.ranks[0], comm.ranks[1]) == (
        ("10.0.0.10", 40004, "10.0.1.10", 30000),)
    model.components(comm, cell)
    assert cell.path == default

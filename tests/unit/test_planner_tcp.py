"""TCP flows as the lab shows them to the planner: both ends of each connection are reported
(the connecting end carries the data, the accepting end only acks from the listener's port),
and ECMP hashes the destination port, so paths are learned per destination port."""
from __future__ import annotations

from c4.core.topology import Topology

from .test_planner_service import frame, planner, tcp_report

SRC, DST = "node000/mlx5_0", "node002/mlx5_0"


def traced(t: Topology, sport: int, dport: int) -> list[str]:
    path = t.ecmp_path(SRC, DST, "tcp", sport, dport)
    assert path is not None
    hops, cur = [], t.links[path[0]].a
    for lid, fwd in t.orient(cur, path[:-1]):
        hops.append(t.switches[t.links[lid].b if fwd else t.links[lid].a].addrs[0])
    return hops


def report(sports: list[int], dport: int, rate: float) -> dict:
    body = tcp_report("10.0.0.1", "10.0.0.3", sports)
    for f in body["tcp_flows"]["flows"]:
        f["dport"], f["bytes_acked_rate"] = dport, rate
    return body


def test_paths_are_learned_per_destination_port() -> None:
    p, t = planner()
    # a heavy connection to port 29500 and one to 7000: the same NIC pair, different hashes
    body = report([40000], 29500, 5e9)
    body["tcp_flows"]["flows"] += report([40001], 7000, 5e9)["tcp_flows"]["flows"]
    p.observe(frame("report", "node000", body), 1.0)
    p.tick(2.0)
    [(_, kind, probe)] = p.take_outbox()
    assert kind == "probe" and sorted(pr["dport"] for pr in probe["probes"]) == [7000, 29500]
    results = [{"id": pr["id"], "sport": sp, "reached": True,
                "hops": traced(t, sp, pr["dport"])}
               for pr in probe["probes"] for sp in pr["sports"]]
    p.observe(frame("probe_result", "node000", {"probe_id": probe["probe_id"],
                                                "results": results}), 2.0)
    for dport in (7000, 29500):
        known = p.pathmap.ports(SRC, DST, f"tcp:{dport}", 2.0)
        assert len(known) == 8
        assert all(path == t.ecmp_path(SRC, DST, "tcp", sp, dport) for sp, path in known.items())
    # the hash really differs by destination port: one class's ports would mislead the other
    assert any(t.ecmp_path(SRC, DST, "tcp", sp, 7000) != path
               for sp, path in p.pathmap.ports(SRC, DST, "tcp:29500", 2.0).items())


def test_the_accepting_end_of_a_stream_is_not_planned() -> None:
    p, t = planner()
    body = report([40000, 40001], 29500, 5e9)  # two data streams node000 -> node002
    # node000's listener also accepted a connection from node002: only acks flow back on it
    body["tcp_flows"]["flows"] += report([29500], 41000, 200.0)["tcp_flows"]["flows"]
    p.observe(frame("report", "node000", body), 1.0)
    for sp in range(42000, 42016):
        for dport in (29500, 41000):
            p.pathmap.learn(SRC, DST, f"tcp:{dport}", sp, t.ecmp_path(SRC, DST, "tcp", sp, dport),
                            1.0)
    v = p.view(2.0)["proposal"]
    assert v["planned"] == 2 and v["unplanned_reasons"] == {"too small to move": 1}
    assert {m["from"] for m in v["moves"]} <= {40000, 40001}
    # the two streams end on different spines
    assert len({m["to_path"][1] for m in v["moves"]}) == 2 == v["moved"]


def test_every_connections_own_port_is_traced_and_a_new_one_at_once() -> None:
    """A plan's gain is judged from the paths the flows take now: each connection's own port
    is traced (not only the first of its pair's), and a reconnect's new port without waiting
    `probe_retry_s` for the pair."""
    p, t = planner()

    def probed(now: float) -> list[int]:
        out = []
        for _, kind, body in p.take_outbox():
            assert kind == "probe"
            out += [sp for pr in body["probes"] for sp in pr["sports"]]
            results = [{"id": pr["id"], "sport": sp, "reached": True,
                        "hops": traced(t, sp, pr["dport"])}
                       for pr in body["probes"] for sp in pr["sports"]]
            p.observe(frame("probe_result", "node000", {"probe_id": body["probe_id"],
                                                        "results": results}), now)
        return out

    p.observe(frame("report", "node000", report([40000, 40001, 40002], 29500, 5e9)), 1.0)
    p.tick(2.0)
    first = probed(2.0)
    assert {40000, 40001, 40002} <= set(first) and len(first) == 8
    assert p.view(2.5)["proposal"]["current_max_util"] is not None
    p.tick(3.0)
    assert probed(3.0) == []  # all known
    p.observe(frame("report", "node000", report([40003], 29500, 5e9)), 4.0)
    p.tick(5.0)
    assert probed(5.0) == [40003]  # the pair has its 8 ports: only the new one


def test_an_accepted_connection_carrying_data_is_not_planned() -> None:
    """gloo sends both ways on one connection, so the end that accepted it carries data from
    the listener's port, which no assignment can change (the agent answered "the live
    connection uses port N"). The collector marks passive opens `accepted`; that end is left
    unplanned with the reason, and only the connecting ends move."""
    p, t = planner()
    body = report([40000, 40001], 29500, 5e9)
    # node000's listener (port 29500 on its side) accepted node002's connection; it sends 5 GB/s
    back = report([29500], 41000, 5e9)["tcp_flows"]["flows"]
    back[0]["accepted"] = True
    body["tcp_flows"]["flows"] += back
    p.observe(frame("report", "node000", body), 1.0)
    for sp in range(42000, 42016):
        for dport in (29500, 41000):
            p.pathmap.learn(SRC, DST, f"tcp:{dport}", sp, t.ecmp_path(SRC, DST, "tcp", sp, dport),
                            1.0)
    v = p.view(2.0)["proposal"]
    assert v["planned"] == 2
    assert v["unplanned_reasons"] == {
        "accepting end: the connecting end's port picks the path": 1}
    assert all(m["from"] != 29500 for m in v["moves"])

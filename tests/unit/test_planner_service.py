"""The planner inside the aggregator: frames in (hello, report, probe_result, plan_result),
probe and plan frames out, link incidents -> re-plan; the API route and `c4 plan`."""
from __future__ import annotations

import sqlite3
import threading

import pytest

from c4.aggregator.planner.config import PlanningConfig
from c4.aggregator.planner.service import Applied, Planner
from c4.core import wire
from c4.core.config import ConfigError, build
from c4.core.topology import Topology
from c4.core.wire import Frame


def topo_with_addresses(hosts: int = 4) -> Topology:
    """`hosts` hosts, 2 per leaf, 2 spines, 2:1 oversubscribed (the fabric is the
    bottleneck); every switch answers probes from a loopback."""
    t = Topology.clos(hosts, 1, hosts_per_leaf=2, spines=2, oversubscription=2.0)
    for i, name in enumerate(t.switches):
        t.switches[name].addrs = [f"10.255.0.{i + 1}"]
    for i, h in enumerate(sorted(t.hosts)):
        t.hosts[h].nics[0].addr = f"10.0.0.{i + 1}"
    t._addrs = None
    return t


def frame(kind: str, host: str, body: dict, seq: int = 1) -> Frame:
    f = Frame(kind, host, "boot1", seq, 1000.0, body)
    return wire.decode(wire.encode(f))  # exactly what ingest would hand over


def hello(host: str, ip: str) -> dict:
    return {"agent_version": "t", "interval": 1.0, "collectors": {},
            "nics": [{"dev": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE",
                                                  "netdev": "eth0"}]}],
            "netdevs": [{"name": "eth0", "addrs": [f"{ip}/24"]}]}


def tcp_report(src_ip: str, dst_ip: str, sports: list[int],
               rates: list[float] | None = None) -> dict:
    flows = []
    for sp, rate in zip(sports, rates or [5e9] * len(sports)):
        flows.append({"saddr": src_ip, "daddr": dst_ip, "sport": sp, "dport": 29500,
                      "family": "ipv4", "netns": 1, "pid": 42, "comm": "python",
                      "state": "ESTABLISHED", "bytes_acked": 10, "bytes_received": 0,
                      "retrans_segs": 0, "bytes_acked_delta": 10, "bytes_received_delta": 0,
                      "retrans_segs_delta": 0, "bytes_acked_rate": rate,
                      "bytes_received_rate": 0.0, "srtt_us": 10, "cwnd": 10, "closed": False})
    return {"interval": 1.0, "health": {}, "tcp_flows": {
        "flows": flows, "omitted": 0, "tracked": len(flows), "map_full": 0, "drops": {},
        "drops_delta": {}}}


def trace(t: Topology, src: str, dst: str, sport: int, proto: str = "tcp",
          dport: int = 29500) -> list[str]:
    """What the fabric does with a 5-tuple: a hash over the equal-cost paths; the routers on
    it answer from their loopbacks."""
    path = t.ecmp_path(src, dst, proto, sport, dport)
    hops, cur = [], t.links[path[0]].a
    for lid, fwd in t.orient(cur, path[:-1]):
        node = t.links[lid].b if fwd else t.links[lid].a
        hops.append(t.switches[node].addrs[0])
    return hops


def planner(incidents=None, **cfg) -> tuple[Planner, Topology]:
    t = topo_with_addresses()
    p = Planner(t, PlanningConfig(probe_ports=8, probe_host_interval_s=0, **cfg),
                sqlite3.connect(":memory:"), incidents=incidents)
    for i, h in enumerate(sorted(t.hosts)):
        p.observe(frame("hello", h, hello(h, f"10.0.0.{i + 1}")), 0.0)
    return p, t


def on_spine(t: Topology, spine: str, n: int) -> list[int]:
    """`n` ports whose connection node000 -> node002 the fabric hashes onto `spine`."""
    return [sp for sp in range(40000, 41000)
            if t.ecmp_path("node000/mlx5_0", "node002/mlx5_0", "tcp", sp, 29500)[1] ==
            f"leaf000-{spine}"][:n]


def colliding(p: Planner, t: Topology, reports: int = 1) -> list[int]:
    """Two connections node000 -> node002 whose ports hash onto the same spine, reported
    `reports` times (0.2 s apart, the last at 1.0)."""
    same = on_spine(t, "spine00", 2)
    for i in range(reports):
        p.observe(frame("report", "node000", tcp_report("10.0.0.1", "10.0.0.3", same)),
                  1.0 - 0.2 * (reports - 1 - i))
    return same


def know_paths(p: Planner, t: Topology, sports: list[int], now: float = 1.0) -> None:
    """16 probed ports and the connections' own, as probes would have learned them."""
    for sp in list(range(41000, 41016)) + sports:
        p.pathmap.learn("node000/mlx5_0", "node002/mlx5_0", "tcp:29500", sp,
                        t.ecmp_path("node000/mlx5_0", "node002/mlx5_0", "tcp", sp, 29500), now)


def answer_probes(p: Planner, t: Topology, now: float) -> int:
    n = 0
    for host, kind, body in p.take_outbox():
        assert kind == "probe" and host == "node000"
        wire.encode(Frame(kind, "aggregator", "b", 1, now, body))  # valid on the wire
        results = []
        for pr in body["probes"]:
            for sp in pr["sports"]:
                results.append({"id": pr["id"], "sport": sp, "reached": True,
                                "hops": trace(t, "node000/mlx5_0", "node002/mlx5_0", sp)})
        p.observe(frame("probe_result", host, {"probe_id": body["probe_id"],
                                               "results": results}), now)
        n += len(results)
    return n


def learned(p: Planner, t: Topology) -> list[int]:
    """`colliding`, probed: 8 ports, the connections' own among them (the paths they take
    now; the agent traces a live connection's 4-tuple on raw sockets)."""
    same = colliding(p, t)
    p.tick(2.0)
    [(_, _, body)] = p.outbox
    assert set(same) <= set(body["probes"][0]["sports"])
    assert answer_probes(p, t, 2.0) == 8
    assert p.stats["paths_learned"] == 8
    return same


def test_probe_learn_plan_apply_and_results():
    p, t = planner()
    same = learned(p, t)
    v = p.view(3.0)["proposal"]
    assert v["current_max_util"] > v["proposed_max_util"]
    assert v["moved"] == 1 and v["moves"][0]["from"] in same
    spines = {m["to_path"][1] for m in v["moves"]}
    assert spines == {"leaf000-spine01"}
    out = p.apply(3.0)
    assert out["hosts"] == ["node000"] and out["assignments"] == 1
    [(host, kind, body)] = p.take_outbox()
    assert (host, kind) == ("node000", "plan")
    wire.encode(Frame(kind, "aggregator", "b", 1, 3.0, body))
    a = body["assignments"][0]
    assert a["proto"] == "tcp" and a["dport"] == 29500 and a["old_sport"] in same
    p.observe(frame("plan_result", "node000", {"plan_id": body["plan_id"], "applied": [],
                                               "failed": [{"id": a["id"],
                                                           "reason": "ECONNREFUSED"}]}), 4.0)
    last = p.view(4.0)["last_plan"]
    assert last["failed"] == [{"host": "node000", "id": a["id"], "reason": "ECONNREFUSED"}]
    row = p.db.execute("SELECT results FROM plans WHERE id=?", (body["plan_id"],)).fetchone()
    assert "ECONNREFUSED" in row[0]


def test_c4_plan_runs_the_optimiser_outside_the_aggregator_lock():
    # GET /api/v1/plan (Api.get -> refresh): input and result under the lock, the optimiser
    # (up to budget_s) without it, so ingest goes on meanwhile
    p, t = planner()
    learned(p, t)
    p.proposal = None
    lock = threading.Lock()
    held: list[bool] = []
    plan = p.engine.plan

    def watched(*args, **kwargs):
        held.append(lock.locked())
        return plan(*args, **kwargs)

    p.engine.plan = watched
    p.refresh(lock, lambda: 3.0, "requested")
    assert held == [False]
    assert p.proposal is not None and p.proposal.result.moved
    p.refresh(lock, lambda: 3.0, "requested")  # fresh: not made again
    p.refresh(lock, lambda: 3.0, "apply", missing_only=True)
    assert held == [False]


def test_the_state_for_a_replan_of_an_unapplied_plan_is_set_up_after_the_plan_out_of_the_lock():
    # a plan leaves the state a re-plan of it unapplied starts from for after its result is
    # out: the API (`refresh`) sets it up outside the aggregator's lock, as it planned; the
    # tick after its own plan, never waiting while the API holds the optimiser (`solving`)
    p, t = planner()
    learned(p, t)
    p.proposal = None
    lock = threading.Lock()
    held: list[bool] = []
    settle = p.engine.settle

    def watched() -> None:
        held.append(lock.locked())
        settle()

    p.engine.settle = watched  # type: ignore[method-assign]
    p.refresh(lock, lambda: 3.0, "requested")
    assert held == [False]
    assert p.engine.unsettled is None and p.engine.placed is not None
    assert p.engine.placed.assign == p.proposal.built.current  # where the flows are
    p.engine.placed = None
    p.propose(3.1, "periodic")
    assert p.engine.unsettled is not None
    with p.solving:
        p.tick(3.1)
    assert p.engine.unsettled is not None and p.engine.placed is None
    p.tick(3.2)
    assert p.engine.unsettled is None and p.engine.placed is not None


def test_a_proposal_solved_outside_the_lock_never_replaces_a_later_one():
    # a link incident's re-plan (tick, under the lock) lands while the API's older job is
    # being solved: the re-plan stays the proposal
    p, t = planner()
    learned(p, t)
    job = p.prepare(3.0, "requested")
    later = p.propose(3.5, "link health changed", replan=True)
    assert p.publish(p.solve(job)) is later and p.proposal is later


def test_probes_are_rate_limited_and_not_repeated():
    p, t = planner()
    p.cfg.probe_sports_per_s = 5.0
    p.tokens = 5.0
    colliding(p, t)
    p.observe(frame("report", "node001", tcp_report("10.0.0.2", "10.0.0.4", [40000])), 1.0)
    p.tick(1.0)
    assert [h for h, _, _ in p.take_outbox()] == ["node000"]  # 8 ports: the bucket is empty
    p.tick(1.5)
    assert p.take_outbox() == []  # still in debt
    p.tick(2.5)
    assert [h for h, _, _ in p.take_outbox()] == ["node001"]
    p.tick(10.0)
    assert p.take_outbox() == []  # both pairs asked within probe_retry_s


def test_a_link_incident_replans_off_the_link_and_auto_applies():
    incidents: list[dict] = []
    p, t = planner(lambda: incidents, auto_apply=True)
    same = colliding(p, t)
    for sp in list(range(41000, 41016)) + same:
        p.pathmap.learn("node000/mlx5_0", "node002/mlx5_0", "tcp:29500", sp,
                        t.ecmp_path("node000/mlx5_0", "node002/mlx5_0", "tcp", sp, 29500), 1.0)
    p.tick(1.0)
    p.take_outbox()
    incidents.append({"id": 7, "class": "hw_link_flap", "state": "open", "localised": 1.0,
                      "suspects": [{"kind": "link", "id": "leaf000-spine00",
                                    "confidence": 0.9}]})
    p.tick(2.0)
    plans = [b for _, k, b in p.take_outbox() if k == "plan"]
    assert len(plans) == 1 and len(plans[0]["assignments"]) == 2  # both left the link
    assert p.health.down == {"leaf000-spine00"}
    assert all(not any("spine00" in lid for lid in sent["path"])
               for sent in p.applied.assignments.values())
    # no entry through the down link survives in the path map
    assert all("leaf000-spine00" not in path for path in
               p.pathmap.ports("node000/mlx5_0", "node002/mlx5_0", "tcp:29500", 2.0).values())


def test_a_link_incident_replans_with_the_garbage_collector_paused(monkeypatch):
    # a full collection landing in the input build took a 16,384-GPU re-plan from ~80 ms to
    # 0.7 s (bench/planner): the whole re-plan, build included, runs with the collector off
    import gc
    incidents: list[dict] = []
    p, t = planner(lambda: incidents, auto_apply=True)
    same = colliding(p, t)
    for sp in list(range(41000, 41016)) + same:
        p.pathmap.learn("node000/mlx5_0", "node002/mlx5_0", "tcp:29500", sp,
                        t.ecmp_path("node000/mlx5_0", "node002/mlx5_0", "tcp", sp, 29500), 1.0)
    p.tick(1.0)
    p.take_outbox()
    seen: list[bool] = []
    build = p.model.build
    monkeypatch.setattr(p.model, "build", lambda *a, **k: seen.append(gc.isenabled()) or
                        build(*a, **k))
    # and the split of the candidate lists the solve makes before the optimiser (elastic
    # demand), which allocates as the build does (bench/planner's service_plan_ms)
    split: list[bool] = []
    splits = p.engine.splits
    monkeypatch.setattr(p.engine, "splits", lambda *a: split.append(gc.isenabled()) or
                        splits(*a))
    incidents.append({"id": 7, "class": "hw_link_flap", "state": "open", "localised": 1.0,
                      "suspects": [{"kind": "link", "id": "leaf000-spine00",
                                    "confidence": 0.9}]})
    p.tick(2.0)
    assert seen == [False] and gc.isenabled()
    p.propose(3.0, "c4 plan")  # a plan asked for (c4 plan, periodic): its build too
    assert seen == [False, False] and gc.isenabled()
    assert split and not any(split), split


def test_the_stall_of_an_applied_plan_does_not_trigger_the_next_one():
    # lab finding: each applied plan's reconnects stalled the ring, C4D named the moved
    # connections' links slow, and the re-plan moved them again (39 plans in 9 minutes)
    incidents: list[dict] = []
    p, t = planner(lambda: incidents, auto_apply=True, interval_s=10.0, settle_s=30.0)
    know_paths(p, t, colliding(p, t, reports=6))  # measured long enough to be planned
    p.tick(1.0)
    [first] = [b for _, k, b in p.take_outbox() if k == "plan"]
    [moved] = first["assignments"]
    slow = {"id": 8, "class": "comm_slow", "state": "open", "localised": 1.0,
            "suspects": [{"kind": "link", "id": "leaf000-spine01", "confidence": 0.9}]}
    incidents.append(slow)
    for now in (2.0, 11.0, 21.0):  # the stall's incident and periodic plans: nothing applied
        p.tick(now)
        assert [k for _, k, _ in p.take_outbox() if k == "plan"] == []
    assert p.health.suspect == {"leaf000-spine01": "incident 8: comm_slow"}
    assert p.stats["plans_applied"] == 1
    p.tick(31.5)  # settled, and the link is still named: now it counts
    assert p.stats["replans"] == 1 and p.proposal is not None
    assert p.proposal.reason == "link health changed: leaf000-spine01"
    # a link going down is re-planned at once, settling or not: the test above


def qp_flow(p: Planner, host: str = "node000") -> None:
    """`host` reports one RC QP (number 100) to node002 (verbs_qp uprobes + the kernel's QP
    list)."""
    gid = "fe80:0000:0000:0000:0000:0000:0000:0003"
    body = hello("node002", "10.0.0.3")
    body["nics"][0]["ports"][0]["gids"] = [gid]
    p.observe(frame("hello", "node002", body), 0.0)
    qp = {"pid": 7, "comm": "python", "lqpn": 100, "rqpn": 200,
          "qp_type": "RC", "state": "RTS", "port": 1, "dgid": gid, "flow_label": 0,
          "sport": 0xC123, "destroyed": False}
    rep = {"interval": 1.0, "health": {}, "verbs_qp": {
        "qps": [qp], "live": 1, "deferred": 0, "stats": {k: 0 for k in (
            "creates", "create_failed", "modifies", "modify_failed", "destroys",
            "destroy_failed", "map_full", "unreported", "read_failed", "netlink_errors",
            "netlink_rejected")},
        "netlink": [{"dev": "mlx5_0", "port": 1, "lqpn": 100, "rqpn": 200, "qp_type": "RC",
                     "state": "RTS", "pid": 7, "comm": "python"}]}}
    p.observe(frame("report", host, rep), 1.0)


def test_verbs_qps_become_roce_flows_keyed_by_qp():
    p, t = planner()
    qp_flow(p)
    [fl] = p.live_flows().values()
    assert (fl.id, fl.proto, fl.dst, fl.sport) == ("qp:mlx5_0:100", "roce", "node002/mlx5_0",
                                                   0xC123)
    p.tick(2.0)
    [(_, kind, body)] = p.take_outbox()
    pr = body["probes"][0]
    assert kind == "probe" and pr["dst"] == "10.0.0.3" and pr["dport"] == 4791
    assert 0xC123 in pr["sports"] and all(0xC000 <= s <= 0xFFFF for s in pr["sports"])


def test_a_confirmed_port_holds_only_for_the_qp_of_the_host_that_confirmed_it():
    # QP numbers are per host: node000's QP 100 and node001's are two flows with one id
    p, t = planner()
    qp_flow(p, "node000")
    qp_flow(p, "node001")
    p.applied = Applied("plan-1", 1.0, "test", {
        Applied.key(h, "qp:mlx5_0:100"): {"host": h} for h in ("node000", "node001")})
    p.observe(frame("plan_result", "node000", {
        "plan_id": "plan-1", "applied": [{"id": "qp:mlx5_0:100", "sport": 0xC200}],
        "failed": []}), 2.0)
    live = p.live_flows()
    assert live[("node000", "qp:mlx5_0:100")].sport == 0xC200
    assert live[("node001", "qp:mlx5_0:100")].sport == 0xC123
    # one plan, two assignments with one id: node000's answer settles only its own
    last = p.view(2.0)["last_plan"]
    assert (last["assignments"], last["applied"]) == (2, 1)
    assert last["waiting"] == ["node001/qp:mlx5_0:100"]


def test_diagnosis_reads_learned_paths_and_asks_for_probes():
    """C4D's PathSource (aggregator/diagnosis/probes.py): a probe on request ahead of the
    retry wait and the per-host interval; the one path a NIC pair's live flows take."""
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.server import build_core

    p, t = planner()
    p.cfg.probe_host_interval_s = 3600.0
    src, dst = "node000/mlx5_0", "node002/mlx5_0"
    qp_flow(p)
    p.tick(2.0)
    assert [k for _, k, _ in p.take_outbox()] == ["probe"]  # its answer is lost
    p.tick(3.0)
    assert p.take_outbox() == []  # asked lately, and the host's interval is an hour
    assert p.learned_path(src, dst, 3.0) is None
    assert not p.request_probe("node001/mlx5_0", dst, 3.0)  # no flow to trace
    assert p.request_probe(src, dst, 3.0)
    p.tick(3.0)
    [(host, _, body)] = p.take_outbox()
    results = [{"id": pr["id"], "sport": sp, "reached": True,
                "hops": trace(t, src, dst, sp, "roce", 4791)}
               for pr in body["probes"] for sp in pr["sports"]]
    p.observe(frame("probe_result", host, {"probe_id": body["probe_id"], "results": results}),
              3.0)
    assert p.learned_path(src, dst, 3.0) == t.ecmp_path(src, dst, "roce", 0xC123, 4791)
    core = build_core(AggregatorConfig(), db_path=":memory:", topology=t)
    assert core.diagnosis.model.paths is core.planner


@pytest.mark.parametrize("key, value", [
    ("suspect_factor", 0.0), ("probe_ports", 65), ("tcp_ports", [60999, 32768]),
    ("budget_s", 0.0), ("probe_sports_per_s", -1.0), ("probe_host_interval_s", -1.0),
    ("min_gain", 1.0), ("suspect_confidence", 1.5)])
def test_planning_config_rejects_values_that_would_silently_stop_or_skew_planning(key, value):
    # a negative probe rate never refills the token bucket: probing would stop without a word
    with pytest.raises(ConfigError, match=rf"^planning\..*{key}"):
        build(PlanningConfig, {key: value}, "planning")
    build(PlanningConfig, {}, "planning")  # the defaults pass

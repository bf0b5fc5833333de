"""Measuring probes as a live aggregator runs them: diagnosis asks the agents (its outbox, sent
by the server with C4P's frames) and reads their `probe_result` frames. The agents' answers
here are what the agent sends (tests/unit/test_agent_measure.py makes them with real sockets):
node001's leg loses a few datagrams every round, node000's none."""
from __future__ import annotations

from typing import Any, Callable

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.diagnosis.findings import Finding, Suspect
from c4.aggregator.server import build_core
from c4.core.topology import Topology
from c4.core.wire import Frame
from c4.core.wire.kinds import validate_body


def fabric(hosts: int = 2) -> Topology:
    """`hosts` hosts split over leaf00 and leaf01 (2: node000 under leaf00, node001 under
    leaf01), one spine, each with an address (a measuring leg needs its switch's)."""
    topo = Topology.leaf_spine(hosts, 1, 2, 1)
    for i, h in enumerate(topo.hosts.values()):
        h.nics[0].addr = f"10.0.{i}.1"
    topo.switches["spine00"].addrs = ["10.9.0.1"]
    topo.switches["leaf00"].addrs = ["10.8.0.1"]
    topo.switches["leaf01"].addrs = ["10.8.1.1"]
    return topo


def path_finding(path: str = "node000->node001") -> Finding:
    """What the loss detector says of a ring's lone host pair (localise.name)."""
    return Finding(
        "comm_slow", "job", "c1",
        [Suspect("path", path, None, None, 0.49),
         Suspect("link", "leaf00-spine00", None, None, 0.49),
         Suspect("link", "leaf01-spine00", None, None, 0.01)],
        "loss on one path", {"candidate_links": {
            "leaf00-spine00": "towards spine00 (the only direction with traffic)",
            "leaf01-spine00": "towards leaf01 (the only direction with traffic)"}}, 90.0)


def measured(seconds: int, lost: Callable[[str, int, str], int],
             finding: Callable[[], Finding] = path_finding, topo: Topology | None = None,
             p90_us: Callable[[str, int, str], int] = lambda host, ttl, via: 500,
             busy_s: Callable[[str, int, str], float] | None = None,
             named: list[float] | None = None,
             ) -> tuple[Finding, dict[tuple[str, int], int]]:
    """The finding after `seconds` of ticks in which the agents answer every measuring
    probe, the leg of host `h` with TTL `ttl` to the switch at `via` losing `lost(h, ttl, via)`
    datagrams of the round, its RTT p90 `p90_us(h, ttl, via)`: (the finding, rounds per leg).
    `busy_s`: the seconds a round of that leg keeps its agent's one prober busy (answers at
    once without); `named`: gets the seconds from the start at which the finding named a link
    from the legs."""
    core = build_core(AggregatorConfig(), db_path=":memory:", topology=topo or fabric())
    diag = core.diagnosis
    asked: dict[tuple[str, int], int] = {}
    seq = 0
    f = finding()
    free: dict[str, float] = {}  # host -> when its prober is free
    due: list[tuple[float, str, dict[str, Any]]] = []
    for t in range(100, 100 + seconds):
        diag.tick(float(t))
        f = diag.measuring.resolve(finding(), float(t))
        if named is not None and "probe" in f.evidence:
            named.append(t - 100.0)
        for host, kind, body in diag.take_outbox():
            assert kind == "probe"
            [p] = validate_body("probe", body)["probes"]
            ttl, via = p["measure"]["ttl"], p["measure"].get("via", [""])[0]
            n = lost(host, ttl, via)
            asked[(host, ttl)] = asked.get((host, ttl), 0) + 1
            result = validate_body("probe_result", {"probe_id": body["probe_id"], "results": [{
                "id": p["id"], "sport": p["sports"][0], "hops": [None] * (ttl - 1) + [via],
                "reached": False, "sent": p["measure"]["count"],
                "answered": p["measure"]["count"] - n,
                "rtt_us": [300, p90_us(host, ttl, via), 900]}]})
            end = float(t)
            if busy_s is not None:
                end = free[host] = max(float(t), free.get(host, 0.0)) + busy_s(host, ttl, via)
            due.append((end, host, result))
        for item in [d for d in due if d[0] <= t]:
            due.remove(item)
            seq += 1
            diag.observe(Frame("probe_result", item[1], "b1", seq, float(t), item[2]), t + 0.5)
    return f, asked


def test_probe_frames_out_and_results_in_name_the_link():
    f, asked = measured(40, lambda host, ttl, via: 2 if host == "node001" else 0)
    # each fabric leg with its NIC's leg to its leaf (the access cable's RTT)
    assert asked and set(asked) == {("node000", 2), ("node001", 2), ("node000", 1),
                                    ("node001", 1)}
    assert max(asked.values()) <= 40 / 3 + 1  # one round per leg every 3-5 s
    assert f.top is not None and (f.top.kind, f.top.id) == ("link", "leaf01-spine00")
    assert f.top.confidence >= 0.8
    assert f.evidence["direction"] == "towards leaf01"


def test_a_leg_is_lossy_against_what_the_other_legs_lose():
    """The lab (a flap of leaf03-spine01 measured live, 2026-12-01): the leg across the link
    lost 0-5 of 400 datagrams a round, the other leg 0-1 a round (answers late on a loaded
    host). Against the 1e-4 assumed background both legs were lossy, so no candidate fitted
    and the path stayed a path; against each other, one leg is."""
    losses = {"node001": [5, 3, 0, 0, 3, 3, 0], "node000": [1, 1, 0, 1, 1, 0]}
    rounds = {"node000": 0, "node001": 0}

    def lost(host: str, ttl: int, via: str) -> int:
        rounds[host] += 1
        return losses[host][(rounds[host] - 1) % len(losses[host])]

    f, _ = measured(60, lost)
    assert f.top is not None and (f.top.kind, f.top.id) == ("link", "leaf01-spine00"), f.suspects
    assert f.evidence["probe"]["signal"] == "loss"


def three_leaves() -> Topology:
    """node000, node001, node002 under leaf00, leaf01, leaf02; two spines with addresses."""
    topo = Topology.leaf_spine(3, 1, 3, 2)
    for i, h in enumerate(topo.hosts.values()):
        h.nics[0].addr = f"10.0.{i}.1"
    topo.switches["spine00"].addrs = ["10.9.0.1"]
    topo.switches["spine01"].addrs = ["10.9.1.1"]
    return topo


def tie_finding() -> Finding:
    """What outage._tie says of connections leaf01 -> leaf00 through spine00 that timed out
    together: the two cables, neither localised."""
    return Finding(
        "comm_slow", "job", "c1",
        [Suspect("link", "leaf00-spine00", None, None, 0.49),
         Suspect("link", "leaf01-spine00", None, None, 0.49)],
        "an outage", {"candidate_links": {"leaf00-spine00": "towards leaf00",
                                          "leaf01-spine00": "towards spine00"}}, 90.0)


def reach_rounds(seconds: int, gone: Callable[[str], dict[str, object] | None]
                 ) -> tuple[Finding, dict[str, str]]:
    """The tie after `seconds` of ticks; host `h` answers `gone(h)` (a result entry's fields
    in place of a measured round) or measures a clean round. (the finding, leg host ->
    its destination address)."""
    core = build_core(AggregatorConfig(), db_path=":memory:", topology=three_leaves())
    diag = core.diagnosis
    dsts: dict[str, str] = {}
    f = tie_finding()
    for seq, t in enumerate(range(100, 100 + seconds)):
        diag.tick(float(t))
        f = diag.measuring.resolve(tie_finding(), float(t))
        for host, _, body in diag.take_outbox():
            [p] = validate_body("probe", body)["probes"]
            dsts[host] = p["dst"]
            count = p["measure"]["count"]
            ttl = p["measure"]["ttl"]  # 1: the leg's access baseline (answered clean)
            entry = (gone(host) if ttl == 2 else None) or {
                "hops": [None] * (ttl - 1) + [p["measure"].get("via", [None])[0]],
                "sent": count, "answered": count, "rtt_us": [300, 500, 900]}
            result = validate_body("probe_result", {"probe_id": body["probe_id"], "results": [
                {"id": p["id"], "sport": p["sports"][0], "reached": False, **entry}]})
            diag.observe(Frame("probe_result", host, "b1", seq, float(t), result), t + 0.5)
    return f, dsts


def test_a_leaf_that_no_longer_forwards_to_the_spine_names_its_cable():
    """A down cable's own leaf drops its next hop at once: every port of node000's leg
    answers from spine01 at TTL 2 (`elsewhere`), while node001's leg reaches spine00. The
    tie of the two cables to spine00 (the connections leaf01 -> leaf00 crossed both) is
    named leaf00-spine00. The legs go towards node002 (leaf02): the far leaf's routes through
    spine00 are withdrawn everywhere, so a leg towards leaf00 would not reach spine00 from
    any leaf."""
    unreached = {"hops": [None, None], "sent": 0, "answered": 0, "elsewhere": 32,
                 "error": "no port of 32 reached 10.9.0.1 at TTL 2"}
    f, dsts = reach_rounds(30, lambda h: unreached if h == "node000" else None)
    assert f.top is not None and (f.top.kind, f.top.id) == ("link", "leaf00-spine00"), \
        f.suspects
    assert f.top.confidence >= 0.8 and f.evidence["probe"]["signal"] == "down"
    assert "leaf00 no longer forwards to spine00" in f.summary, f.summary
    assert dsts == {"node000": "10.0.2.1", "node001": "10.0.2.1"}


def test_a_leg_that_hears_nothing_names_nothing():
    """Silence (no port's hop answered: an ICMP policer, a host that cannot send) is no
    sign the leaf stopped forwarding: the tie stays a tie."""
    silent = {"hops": [None, None], "sent": 0, "answered": 0,
              "error": "no port of 32 reached 10.9.0.1 at TTL 2"}
    f, _ = reach_rounds(30, lambda h: silent if h == "node000" else None)
    assert f.top is not None and f.top.confidence < 0.8 and "probe" not in f.evidence


def path_and_cables() -> Finding:
    """A lone connection node000 -> node001 counting loss: its path's four cables, each the
    way it crosses them."""
    return Finding(
        "comm_slow", "job", "c1",
        [Suspect("path", "node000/mlx5_0->node001/mlx5_0", None, None, 0.2),
         Suspect("link", "leaf00-spine00", None, None, 0.2)],
        "loss on one path", {"candidate_links": {
            "leaf00-spine00": "towards spine00", "leaf01-spine00": "towards leaf01",
            "node000/mlx5_0-leaf00": "towards leaf00",
            "node001/mlx5_0-leaf01": "towards node001/mlx5_0"}}, 90.0)


def test_a_leg_losing_one_datagram_a_round_is_told_from_one_losing_none_in_8_rounds():
    """0.25 % loss (1 of 400 a round) up leaf00=>spine00 on a lone connection's path. Only
    node000's leg to the spine loses; its leg to its leaf (the access cable alone) must vote
    clean to clear that cable: 8 losses against none of as many datagrams are 1 chance in 256
    if both legs crossed the loss. That vote took a bound on the lossy rate and a test at it,
    which needed about 10 losses against none (the adversarial corpus: such a link named after
    42 s of rounds)."""
    f, asked = measured(34, lambda host, ttl, via: 1 if (host, ttl) == ("node000", 2) else 0,
                        path_and_cables)
    assert set(asked) == {("node000", 2), ("node000", 1), ("node001", 2), ("node001", 1)}
    assert asked[("node000", 2)] <= 9, asked
    assert f.top is not None and (f.top.kind, f.top.id) == ("link", "leaf00-spine00"), f.summary
    legs = {(leg["src"], leg["ttl"]): leg["lost"] for leg in f.evidence["probe"]["legs"]}
    assert legs[("node000/mlx5_0", 1)] == 0 and 0 < legs[("node000/mlx5_0", 2)] <= 9, legs


def two_per_leaf() -> Topology:
    """node000, node001 under leaf00; node002, node003 under leaf01; two spines; every
    switch with an address."""
    topo = Topology.leaf_spine(4, 1, 2, 2)
    for i, h in enumerate(topo.hosts.values()):
        h.nics[0].addr = f"10.0.{i}.1"
    for i, sw in enumerate(sorted(topo.switches)):
        topo.switches[sw].addrs = [f"10.9.{i}.1"]
    return topo


def cable_and_link(access: str, spine: str) -> Callable[[], Finding]:
    """A tie of a fabric link of leaf01 and one host's access cable under leaf01 (a lab run:
    connections into node002 slowed by leaf01-spine01 at 10 Mbit/s: 0.50 each)."""
    return lambda: Finding(
        "comm_slow", "job", "c1",
        [Suspect("link", f"leaf01-{spine}", None, None, 0.5),
         Suspect("link", f"{access}-leaf01", None, None, 0.5)],
        "a tie", {"candidate_links": {f"leaf01-{spine}": "towards leaf01",
                                      f"{access}-leaf01": f"towards {access}"}}, 90.0)


def test_a_tie_with_a_hosts_cable_measures_the_link_from_another_host():
    """The fabric link's leg came from the first host under leaf01, node002, whose access
    cable is the other candidate: it crossed both, was dropped, and nothing was measured. Now
    it comes from node003 and crosses the fabric link alone."""
    lossy = "10.9.3.1"  # spine01 (sorted switches: leaf00, leaf01, spine00, spine01)
    f, asked = measured(30, lambda host, ttl, via: 5 if via == lossy else 0,
                        cable_and_link("node002/mlx5_0", "spine01"), two_per_leaf())
    assert ("node003", 2) in asked and ("node002", 1) in asked, asked
    probe = f.evidence.get("probe", {})
    assert (probe.get("named"), probe.get("signal")) == ("leaf01-spine01", "loss"), f.summary
    assert f.top is not None and f.top.id == "leaf01-spine01" and f.top.confidence > 0.9


def test_a_leg_without_a_peer_of_its_ttl_is_timed_against_a_control_leg():
    """The lab: leaf01-spine00 at 10 Mbit/s tied with node003's access cable. Its leg to
    spine00 queued (43 ms p90) and the leg to leaf01 did not (0.15 ms), but RTT compares legs
    of one TTL and each was alone: no vote in 50 s. A control leg from the same NIC to the
    other spine (0.5 ms) is what the slow one is judged against."""
    slow = "10.9.2.1"  # spine00 (sorted switches: leaf00, leaf01, spine00, spine01)
    f, asked = measured(30, lambda host, ttl, via: 0,
                        cable_and_link("node003/mlx5_0", "spine00"),
                        two_per_leaf(), lambda host, ttl, via: 43000 if via == slow else 500)
    assert ("node002", 2) in asked and ("node003", 1) in asked, asked
    probe = f.evidence.get("probe", {})
    assert (probe.get("named"), probe.get("signal")) == ("leaf01-spine00", "rtt"), f.summary
    assert {(leg["via"], tuple(leg["crosses"])) for leg in probe["legs"] if leg["ttl"] == 2} \
        == {("spine00", ("leaf01-spine00",)), ("spine01", ())}


def across_spine01() -> Finding:
    """Lab run X: loss counted on connections node000 -> node002 through spine01, tying
    leaf00's uplink to it with leaf01's downlink from it."""
    return Finding(
        "comm_slow", "job", "c1",
        [Suspect("path", "node000->node002", None, None, 0.49),
         Suspect("link", "leaf00-spine01", None, None, 0.25),
         Suspect("link", "leaf01-spine01", None, None, 0.25)],
        "loss on one path", {"candidate_links": {
            "leaf00-spine01": "towards spine01 (the only direction with traffic)",
            "leaf01-spine01": "towards leaf01 (the only direction with traffic)"}}, 90.0)


def test_a_leg_slow_in_its_own_access_cable_names_no_fabric_link():
    """Run X: node002's cable queued the ring's traffic, so its leg to spine01 took 5.0 ms
    (p90) against node000's 0.22 ms and the probes named leaf01-spine01, which was healthy
    (the slow link was leaf01-spine00). Its own leg to leaf01 takes as long: the access cable,
    not the hop."""
    f, asked = measured(40, lambda host, ttl, via: 0, across_spine01, two_per_leaf(),
                        lambda host, ttl, via: 5220 if host == "node002" else 220)
    assert ("node002", 1) in asked and ("node002", 2) in asked, asked
    assert "probe" not in f.evidence, f.evidence.get("probe")
    assert f.top is not None and f.top.kind == "path"


def test_a_slow_hop_is_named_above_a_queued_access_cable():
    # the same cable queueing, and the hop from leaf01 to spine01 slower still
    spine01 = "10.9.3.1"
    f, _ = measured(40, lambda host, ttl, via: 0, across_spine01, two_per_leaf(),
                    lambda host, ttl, via: 5220 + (20000 if ttl == 2 and via == spine01 and
                                                   host == "node002" else 0)
                    if host == "node002" else 220)
    probe = f.evidence.get("probe", {})
    assert (probe.get("named"), probe.get("signal")) == ("leaf01-spine01", "rtt"), f.summary
    [leg] = [leg for leg in probe["legs"] if leg["src"] == "node002/mlx5_0"]
    assert leg["access_p90_ms"] == 5.22 and leg["rtt_p90_ms"] == 25.22


def test_a_leg_slow_enough_to_keep_its_prober_busy_is_named_within_the_link_target():
    """Lab run Y (leaf03-spine01 at 10 Mbit/s, one leaf pair's): the legs to spine01 from under
    leaf03 queued 38 ms (p90) against 0.14-0.2 ms elsewhere, and a round of such a leg kept
    its agent's one prober busy 6.5 s (its TTL-1 leg 2 s), so its rounds came 8.5 s apart.
    RTT voted after 4 rounds: named 35 s after the first leg was asked (45 s after the fault).
    Two rounds longer apart than a burst (HOLD_S) settle it as well."""
    slow = "10.9.3.1"  # spine01 (sorted switches: leaf00, leaf01, spine00, spine01)
    at: list[float] = []
    f, _ = measured(50, lambda host, ttl, via: 0, across_spine01, two_per_leaf(),
                    lambda host, ttl, via: 38000 if via == slow and host == "node002" else 200,
                    busy_s=lambda host, ttl, via: 6.5 if via == slow and host == "node002"
                    else 2.0, named=at)
    probe = f.evidence.get("probe", {})
    assert (probe.get("named"), probe.get("signal")) == ("leaf01-spine01", "rtt"), f.summary
    assert at and at[0] <= 20, at

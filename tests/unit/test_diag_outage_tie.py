"""C4D's outage detector when the evidence ties between the two ends of the same paths
(aggregator/diagnosis/outage.py), on recordings of the real lab (tests/fixtures/lab:
`bench/lab --record`, the ring job on the default 8-host fabric, eBPF agents, trimmed after
the fault):
- 03-down-leaf02-spine01: the link taken down while only leaf01's connections sent towards
  leaf02 through it: two leaf01 -> leaf02 flows retransmitted at the ACK timeouts in 3 and 4
  reports and two connections were stuck in a stall message, all crossing leaf01-spine01 and
  leaf02-spine01 alike; node003's leaf01 -> leaf00 flow retransmitted in 2 reports (at the
  fault and as the ring resumed) beside node003's flow through the down link in 4, and
  crossed leaf01-spine01 only. It named leaf01-spine01 at 0.99, 9 s after the fault;
- 04-flap-leaf01-spine01: leaf00 <-> leaf01 flows through the flapping link retransmitted in
  8 and 9 reports of the window, crossing leaf00-spine01 and leaf01-spine01 alike; one
  leaf03 -> leaf00 flow (its host's only retransmitting one) in 2, crossing leaf00-spine01
  only. It named leaf00-spine01 at 0.99, 43 s after the fault started; C4P's paths of the
  run (.paths.json: C4P had moved connections before) place the flows as live;
- 05-down-leaf00-spine01: leaf01 -> leaf00 flows and connections blackholed (named from
  them), then, 30 s on, two leaf00 -> leaf01 connections still stuck waiting for acks while
  their flows did not retransmit: they alone named leaf01-spine01 once the tie was broken by
  the leaf connections enter, before flows were required;
- 10-down-leaf02-spine00 (lab run F): leaf03 -> leaf02 connections stuck and flows
  retransmitting, the belief split between the cable failing both ways (0.55) and into
  leaf02 (0.43): one cable, but neither reached 0.8 and nothing was named;
- 12-down-leaf03-spine01-replan (lab run H): named, then C4P moved the connections and a
  second link was named from the same evidence."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.model import Model
from c4.aggregator.diagnosis.outage import OutageDetector
from c4.core import record, wire
from tests.unit.test_diag_outage import named_after, outage_findings, rewrite, run, unpack


@pytest.mark.parametrize("name,link,within_s", [
    ("03-down-leaf02-spine01", "leaf02-spine01", 10.0),
    ("04-flap-leaf01-spine01", "leaf01-spine01", 30.0),
    ("05-down-leaf00-spine01", "leaf00-spine01", 10.0),
    ("10-down-leaf02-spine00", "leaf02-spine00", 10.0)])
def test_a_tie_is_broken_by_the_leaf_the_blackholed_data_enters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, link: str,
        within_s: float) -> None:
    seen = outage_findings(name, tmp_path, monkeypatch)
    named = {f.suspects[0].id for _, f in seen}
    # never the other end: a bystander flow or connections stuck on their acks named it
    assert named == {link}, [(round(t, 1), f.suspects[:2]) for t, f in seen]
    assert min(t for t, _ in seen) <= within_s
    # the blackhole's way (its data enters that leaf), or both where flows clean through the
    # other end named it first (the acks of connections leaving the leaf cross it too)
    assert {f.evidence["direction"] for _, f in seen} <= {f"towards {link.partition('-')[0]}",
                                                          "both"}



def test_a_flow_clean_through_one_end_breaks_the_tie(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """08-flap-leaf01-spine00 (lab run E, docs/benchmarks.md): every bad flow went leaf02 ->
    spine00 -> leaf01, so it crossed both ends alike and no connection was stuck; node004's
    flow leaf02 -> spine00 -> leaf03 kept moving data at the timeouts. That clears
    leaf02 -> spine00: the flapping link is named. Before: nothing, for the whole flap."""
    seen = outage_findings("08-flap-leaf01-spine00", tmp_path, monkeypatch)
    assert {f.suspects[0].id for _, f in seen} == {"leaf01-spine00"}, \
        [(round(t, 1), f.suspects[:2]) for t, f in seen]
    assert min(t for t, _ in seen) <= 10.0


def test_a_link_only_one_host_crosses_is_named_as_its_path(tmp_path: Path) -> None:
    """09-flap-leaf03-spine01 (lab run E): only node005 -> node007 crossed the flapping link;
    with one sending host nothing separates the links of its path. Named as that path, the
    link among its candidates, not localised (the measuring probes may single it out live).
    Before: nothing."""
    name = "09-flap-leaf03-spine01"
    rec, truth = unpack(name, tmp_path)
    (inc,) = run(rec, truth)
    assert inc["suspects"][0]["kind"] == "path", inc["suspects"]
    assert inc["suspects"][0]["id"] == "node005/mlx5_0->node007/mlx5_0"
    assert "leaf03-spine01" in inc["evidence"]["candidate_links"]
    assert inc["localised"] is None


def test_a_lone_path_whose_receiver_times_out_too_is_named_as_its_path(tmp_path: Path) -> None:
    """27-flap-leaf03-spine01-both-ends: the same lone pair under a flap that stays down its
    whole 1 s (09 was recorded while the lab's flap came up again after 30-40 ms). node007,
    the receiver, now times out too: its replies' acks come back the blackholed way. Its NIC's
    observation covered node007's own sends, none through the link, and host node007 explained
    both NICs: nothing was opened in 80 s of flapping (a CI run's root test). The receiver's
    timeouts are the pair's: named as its path, the link among the candidates."""
    name = "27-flap-leaf03-spine01-both-ends"
    rec, truth = unpack(name, tmp_path)
    timed = set()  # hosts whose NIC counted ACK timeouts after the injection
    start = truth["epoch"] + truth["faults"][0]["start"]
    last: dict[str, int] = {}
    for data in record.read(rec):
        f = wire.decode(data)
        for port in (f.body.get("rdma") or {}).get("ports", []) if f.kind == "report" else ():
            n = port["counters"].get("local_ack_timeout_err")
            if n is not None and f.ts > start and n > last.get(f.host, n):
                timed.add(f.host)
            if n is not None:
                last[f.host] = n
    assert timed == {"node005", "node007"}
    (inc,) = run(rec, truth)
    assert inc["suspects"][0]["id"] == "node005/mlx5_0->node007/mlx5_0", inc["suspects"]
    assert "leaf03-spine01" in inc["evidence"]["candidate_links"]
    assert inc["localised"] is None


def test_a_flapping_link_tied_with_a_hosts_cable_is_measured(tmp_path: Path) -> None:
    """28-flap-leaf00-spine00-host-tie (bench/lab, 2026-12-07, a 1 s / 3 s flap after C4P's
    plan): every bad observation went into or out of node001, so the cable (0.5) tied with
    node001's own access cable (0.5), one fabric cable only: no tie opened and nothing at all
    was named for the 40 s of flapping; the flows retransmitted in about half their reports,
    too many to count as phases, so the tie waited for the flap to end. Now a tie of both
    cables while it flaps, for the measuring probes to separate."""
    name = "28-flap-leaf00-spine00-host-tie"
    rec, truth = unpack(name, tmp_path)
    start = truth["epoch"] + truth["faults"][0]["start"]
    end = truth["epoch"] + truth["faults"][0]["end"]
    incs = run(rec, truth)
    assert incs, "nothing opened"
    inc = incs[0]
    assert inc["detected"] < end and inc["detected"] - start <= 15.0, inc["detected"] - start
    assert set(inc["evidence"]["candidate_links"]) == {"leaf00-spine00",
                                                         "node001/mlx5_0-leaf00"}
    assert inc["localised"] is None  # a tie: the probes name it live


def test_a_bystander_retransmitting_at_another_hosts_timeouts_names_nothing(
        tmp_path: Path) -> None:
    """09-flap-leaf03-spine01 with a bystander, as a live root test run showed it
    (2026-12-01): node002's flow to node004 (leaf01 -> spine01 -> leaf02, its own NIC never
    timing out: fast retransmits) retransmits in the reports where node005's flow through
    the flapping link does. It crosses leaf02-spine01 the other way, and with node005's
    flow the cable both ways explained two hosts: leaf02-spine01 was named (0.83). Its
    retransmits are not at its own sender's timeouts: the path finding stays as without it."""
    name = "09-flap-leaf03-spine01"
    rec, truth = unpack(name, tmp_path)
    lone: list[float] = []  # when node005's flow through the flapping link retransmitted
    for data in record.read(rec):
        f = wire.decode(data)
        if f.kind == "report" and f.host == "node005":
            lone += [f.ts for x in (f.body.get("tcp_flows") or {}).get("flows", [])
                     if x["sport"] == 45925 and x["retrans_segs_delta"] >= 2]
    assert len(lone) >= 8

    def bystander(f: wire.Frame) -> None:
        if f.host != "node002" or not any(0 <= f.ts - t < 1.0 for t in lone):
            return
        for x in (f.body.get("tcp_flows") or {}).get("flows", []):
            if x["sport"] == 42086:
                x["retrans_segs_delta"] = 3

    rewrite(rec, bystander)
    incs = run(rec, truth)
    assert not any(i["localised"] for i in incs), [(i["summary"], i["suspects"][:2])
                                                   for i in incs]
    (inc,) = incs
    assert inc["suspects"][0]["id"] == "node005/mlx5_0->node007/mlx5_0"


def test_a_replan_moving_the_stuck_connections_names_no_second_link(tmp_path: Path) -> None:
    """12-down-leaf03-spine01-replan (lab run H, C4P applying plans on its own): the down
    link named at 1.0 from 5 hosts' timeouts, stuck connections and retransmitting flows;
    C4P moved the connections off it, and their stall messages at the reconnect, with the
    same NICs' timeouts still in the window, named leaf03-spine00 (0.86) 4 s later, a second
    incident from a subset of the first one's evidence. One fault, one incident."""
    name = "12-down-leaf03-spine01-replan"
    rec, truth = unpack(name, tmp_path)
    incs = run(rec, truth)
    assert [(i["suspects"][0]["id"], bool(i["localised"])) for i in incs] == \
        [("leaf03-spine01", True)], [(i["summary"], i["suspects"][:2]) for i in incs]


# 15-down-leaf00-spine00-tie (lab run J, 2026-12-01, C4P applying: its periodic plan 69 s
# before had spread the ring): the link down blackholed node002's data into leaf00 and the ACKs
# of node000's and node001's connections to leaf01 (their data rerouted at once by leaf00);
# all three hosts' NICs timed out, leaf00 -> leaf01 and leaf01 -> leaf00 flows retransmitted
# alike and the stuck connections went both ways: the two ends of the same paths tie on the
# data's paths (leaf00-spine00 down: what enters leaf00 by spine00 is lost, node002's data and
# node000's ACKs; leaf01-spine00 down: what enters leaf01 by spine00, node000's data and
# node002's ACKs), and the lab's ECMP hash is symmetric (Linux's flow hash), so the acks take
# the same spine back. The two ends' counters tell which way was lost: node000's connection
# stalled with its receiver 26,844 bytes ahead of what node000 saw acknowledged (the acks were
# lost), node002's with its receiver level (the data was).
TIE = "15-down-leaf00-spine00-tie"


def test_a_two_ended_tie_names_neither_end_wrongly(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    seen = outage_findings(TIE, tmp_path, monkeypatch)
    assert {f.suspects[0].id for _, f in seen} <= {"leaf00-spine00"}, \
        [(round(t, 1), f.suspects[:2]) for t, f in seen]


def test_a_two_ended_tie_is_named_from_the_way_the_traffic_was_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: no rule separated it (the live run named the link 46 s after the fault, by the
    slow detector); a strict xfail here."""
    seen = outage_findings(TIE, tmp_path, monkeypatch)
    assert seen and {f.suspects[0].id for _, f in seen} == {"leaf00-spine00"}
    assert min(t for t, _ in seen) <= 10.0
    ev = seen[0][1].evidence
    assert ev["direction"] == "towards leaf00" and ev["acks_lost"], ev


def flow(saddr: str, sport: int, daddr: str, dport: int, acked: int, received: int,
         retrans: int = 0) -> dict[str, Any]:
    """A stalled tcp_flows row (no data either way in its report)."""
    return {"saddr": saddr, "sport": sport, "daddr": daddr, "dport": dport, "closed": False,
            "bytes_acked": acked, "bytes_received": received, "bytes_acked_delta": 0,
            "bytes_received_delta": 0, "retrans_segs_delta": retrans, "rto_delta": retrans}


@pytest.mark.parametrize("gap,way", [(26_844, "acks"), (0, "data"), (1, "data"),
                                     (4 << 30, None), (-5000, None)])
def test_which_way_a_stalled_connection_lost_traffic(gap: int, way: str | None) -> None:
    """Both ends stalled, the sender timing out: its receiver ahead of what it saw acknowledged
    (node000's connection in run J: 26,844 bytes) lost the acks, level (one byte: a FIN) the
    data; a gap beyond any receive buffer (an agent that began counting mid-connection: each
    end counts from when it first saw the flow) or behind says nothing."""
    det = OutageDetector(DiagnosisConfig(), Model(None), {})
    det.on_flows("a", {"flows": [flow("10.0.0.1", 40000, "10.0.1.1", 30000, 10**9, 500,
                                      retrans=1)]}, 100.0)
    det.on_flows("b", {"flows": [flow("10.0.1.1", 30000, "10.0.0.1", 40000, 500,
                                      10**9 + gap)]}, 100.4)
    got = det.ways.get(("10.0.0.1", 40000, "10.0.1.1", 30000))
    assert [w for _, w in got or ()] == ([way] if way else [])
    # the receiver is no sender: nothing said of its way
    assert not det.ways.get(("10.0.1.1", 30000, "10.0.0.1", 40000))


ALIAS = "18-down-leaf02-spine00-alias"


def test_a_tie_inside_one_hypothesis_is_broken_by_the_blackholes_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """18-down-leaf02-spine00-alias (lab run M, 2026-12-01, C4P applying its plans): after the
    spread only leaf02 <-> leaf03 connections crossed spine00, both ways. leaf02-spine00 and
    leaf03-spine00 explained the same observations, so they were one hypothesis (aliases, 0.48
    each), and the blackhole's way counted only the hypothesis' own cable: 0.48, under the
    localise confidence, nothing named (a comm_hang on node006 at 0.46 instead). Every stalled
    connection's lost traffic entered leaf02 by leaf02-spine00: named towards leaf02."""
    seen = outage_findings(ALIAS, tmp_path, monkeypatch)
    assert seen and {f.suspects[0].id for _, f in seen} == {"leaf02-spine00"}, \
        [(round(t, 1), f.suspects[:2]) for t, f in seen]
    assert min(t for t, _ in seen) <= 10.0
    assert seen[0][1].evidence["direction"] == "towards leaf02"
    assert seen[0][1].evidence["blackhole"]["tied"] == ["leaf02-spine00", "leaf03-spine00"]
    assert "suspect: link leaf02-spine00; " in seen[0][1].summary, seen[0][1].summary


PAIR_FLAP = "19-flap-leaf03-spine00-pair"


def test_a_flap_between_one_leaf_pair_is_told_by_which_end_dropped_duplicates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """19-flap-leaf03-spine00-pair (lab run M, 2026-12-01, C4P applying its plans): only
    leaf02 <-> leaf03 connections crossed spine00, both ways, and the 1 s outages stalled none
    long enough for a stall message: the two cables tied (0.50) and nothing was named for the
    whole flap. Which end dropped duplicates tells each connection's way: the leaf02 -> leaf03
    senders (their data lost), the leaf03 -> leaf02 receivers (their acks lost), so everything
    lost entered leaf03 by leaf03-spine00; phase after phase, with clean reports between: an
    outage, not loss. (Between two phases the tie is an unlocalised finding of both cables,
    outage._tie, for the measuring probes: never a name.)"""
    found = outage_findings(PAIR_FLAP, tmp_path, monkeypatch)
    seen = [(t, f) for t, f in found if f.suspects[0].confidence >= 0.8]
    ties = [f for _, f in found if f.suspects[0].confidence < 0.8]
    assert all(set(f.evidence["candidate_links"]) == {"leaf02-spine00", "leaf03-spine00"}
               for f in ties)
    assert seen and {f.suspects[0].id for _, f in seen} == {"leaf03-spine00"}, \
        [(round(t, 1), f.suspects[:2]) for t, f in seen]
    # 8.8 s since a flow that retransmits in half its reports is phased (21.8 s before)
    assert min(t for t, _ in seen) <= 15.0
    f = seen[0][1]
    assert f.evidence["direction"] == "towards leaf03"
    assert f.evidence["blackhole"]["tied"] == ["leaf02-spine00", "leaf03-spine00"]
    assert f.evidence["aliases"] == []  # named, the link is no alias of itself
    # the leaf03 -> leaf02 connections' receivers dropped the duplicates: their acks' way
    # (first named from the flows that lost their data; this joins as the receivers report)
    assert any(g.evidence["acks_lost"] == ["node006->node005", "node007->node004"]
               for _, g in seen)


LOSS_UP = "20-loss-up-leaf00-spine01"


def test_loss_up_a_leafs_uplink_moves_no_flow_onto_its_acks_way(tmp_path: Path) -> None:
    """20-loss-up-leaf00-spine01 (lab run O, 2026-12-02, C4P applying its plans): 2 % loss
    one way, up leaf00's cable to spine01. Needless resends make receivers drop duplicates
    under loss too: a draft that let those verdicts move bad flows onto their acks' way for
    every vote named the host pair node000<->node006 at 0.96 (a flow's data and acks share
    only their two hosts). Duplicates decide only the blackhole's way, after an outage's
    phases, so nothing but the lossy link may be named here. (Replayed without the live run's
    measuring probes C4D names nothing; live, with them, it named the link in 24 s.)"""
    rec, truth = unpack(LOSS_UP, tmp_path)
    named = [i["suspects"][0]["id"] for i in run(rec, truth) if i["localised"]]
    assert set(named) <= {"leaf00-spine01"}, named


def phased_verdicts(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every verdict of the outage detector's `_phased` in a replay of a lab fixture."""
    got: list[bool] = []
    phased = OutageDetector._phased

    def seen(self: OutageDetector, *a: Any) -> bool:
        got.append(phased(self, *a))
        return got[-1]

    monkeypatch.setattr(OutageDetector, "_phased", seen)
    tmp_path.mkdir()
    run(*unpack(name, tmp_path))
    return got


def test_a_flaps_phases_are_an_outage_and_steady_loss_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What lets the blackhole tie-break act without a stall message: a flap's flows lose
    traffic in phases with clean reports between (19: an outage once its phases accumulate),
    a lossy link's report after report (20, 2 % one way up: never, although the tie-break
    asks on every evaluation of its tie; it would name the far end's cable, the way the
    connections' lost traffic enters a leaf)."""
    flap = phased_verdicts(PAIR_FLAP, tmp_path / "flap", monkeypatch)
    assert flap and any(flap), flap
    loss = phased_verdicts(LOSS_UP, tmp_path / "loss", monkeypatch)
    assert loss and not any(loss), loss


def test_a_tie_names_nothing_that_would_hide_the_cable_named_later() -> None:
    """_one_fault keeps one incident per fault by the components it named: a tie (outage._tie,
    unlocalised, its top the first cable by mass) names none, or the cable measured or
    broken out of it later, on a subset of the same evidence, would be dropped as the tie's."""
    from c4.aggregator.diagnosis.findings import Finding, Suspect

    det = OutageDetector(DiagnosisConfig(), Model(None), {})
    bad = frozenset({("nic", "node006/mlx5_0"), ("nic", "node007/mlx5_0")})
    tie = Finding("comm_slow", "job", "c1", [Suspect("link", "leaf03-spine00", None, None, 0.5),
                                            Suspect("link", "leaf00-spine00", None, None, 0.5)],
                  "tie", {}, 0.0)
    named = Finding("comm_slow", "job", "c1",
                    [Suspect("link", "leaf00-spine00", None, None, 0.99)], "named", {}, 0.0)
    assert det._one_fault(tie, bad, 10.0)
    assert det._one_fault(named, bad, 11.0)


def test_loss_both_ways_that_stalls_the_ring_is_no_blackhole(tmp_path: Path) -> None:
    """26-loss-leaf01-spine00-both (lab run AE, docs/benchmarks.md): 5 % loss both ways on
    leaf01-spine00 stalled a connection of the ring, so the outage detector took it for an
    outage, and the blackhole's way named leaf02-spine00, the far end of the same paths, at
    1.00 in a second incident beside the right one, though a connection had crossed
    leaf02-spine00 clean and none crossed leaf01-spine00 clean. A blackhole into leaf02
    would have taken that one too: only leaf01-spine00 is named."""
    rec, truth = unpack("26-loss-leaf01-spine00-both", tmp_path)
    named = named_after(run(rec, truth), truth)
    assert set(named) == {"leaf01-spine00"}, named
    assert named["leaf01-spine00"] <= 10.0

"""Measuring probes (aggregator/diagnosis/probes.py `Measuring`): a ring alone on its leaves
sends what goes up `leaf00=>spine00` down `spine00=>leaf01` and nothing else crosses either,
so the matrix and the NIC counters name the path; datagrams TTL-limited to the spine from a
host under each leaf (the simulator answers them from the injected fault, lab/sim.py
`SimMeasurer`) name the link, or nothing when the loss is too low for them to see."""
from __future__ import annotations

from c4.aggregator.replay import replay
from c4.lab.evaluate import clock_origin, load_truth, score
from c4.lab.sim import Fault, SimConfig, Simulator, SimMeasurer

SMALL = dict(hosts=4, gpus_per_host=4, leaves=4, spines=2)


def run(tmp_path, spec: str, *, measure: bool, seed: int = 5, **fabric):
    sim = Simulator(SimConfig(duration=80, seed=seed, noise=0.05, realism=False,
                              faults=[Fault.parse(spec)], **(fabric or SMALL)))
    out = tmp_path / "run.c4rec"
    sim.run(out)
    truth = load_truth(out)
    origin = clock_origin(out, truth)
    res = replay(out, measurer=SimMeasurer(sim, origin) if measure else None)
    return res.incidents, score(truth, res.incidents, origin)


def test_loss_down_from_the_spine_is_named_after_measuring(tmp_path):
    """1 % loss on spine00=>leaf01 only: without probes the honest answer is the path
    node000->node001 with both candidates; the legs from node000 (crosses leaf00-spine00) and
    node001 (its answers come down spine00=>leaf01) single out leaf01-spine00."""
    spec = "lossy-link:leaf01-spine00@20;loss=0.01;dir=down"
    incidents, sc = run(tmp_path, spec, measure=False)
    assert sc.named == 0 and sc.on_path == 1, [i["summary"] for i in incidents]

    incidents, sc = run(tmp_path, spec, measure=True)
    assert sc.named == 1 and sc.false_incidents == 0, [i["summary"] for i in incidents]
    [inc] = incidents
    assert inc["suspects"][0] == {**inc["suspects"][0], "kind": "link", "id": "leaf01-spine00"}
    assert inc["evidence"]["direction"] == "towards leaf01"
    probe = inc["evidence"]["probe"]
    assert probe["signal"] == "loss"
    lossy = [leg for leg in probe["legs"] if leg["lost"]]
    assert [leg["crosses"] for leg in lossy] == [["leaf01-spine00"]]


def test_slow_link_is_named_from_the_probes_rtt(tmp_path):
    """spine00=>leaf01 at 1/2.5 of its rate, no loss: the probes crossing it queue behind the
    job's traffic there (only under load), the others do not."""
    incidents, sc = run(tmp_path, "slow-fabric:leaf01-spine00@20;x=2.5;dir=down",
                        measure=True)
    assert sc.named == 1 and sc.false_incidents == 0, [i["summary"] for i in incidents]
    assert incidents[0]["evidence"]["probe"]["signal"] == "rtt"


def test_loss_too_low_for_the_probes_stays_a_path(tmp_path):
    """0.05 % on leaf00=>spine00: the NIC counters see it (thousands of packets a second), a
    few hundred datagrams a round mostly do not. Nothing the legs saw singles out a link: the
    incident stays the path with its candidates, never the wrong link."""
    incidents, sc = run(tmp_path, "lossy-link:leaf00-spine00@20;loss=0.0005;dir=up",
                        measure=True)
    assert sc.named == 0 and sc.on_path == 1 and sc.false_incidents == 0, \
        [i["summary"] for i in incidents]
    assert all(i["localised"] is None for i in incidents)


def test_another_tenants_burst_on_one_leg_names_nothing(tmp_path):
    """The fault (0.05 % on spine00=>leaf01) is too low for node001's leg to see; a 6 s burst
    of another tenant on leaf00=>spine00 drops and queues node000's datagrams for two rounds.
    A burst is not a fault: the loss and the RTT of two rounds within 6 s do not vote."""
    sim = Simulator(SimConfig(duration=80, seed=5, noise=0.05, realism=False,
                              faults=[Fault.parse(
                                  "lossy-link:leaf01-spine00@20;loss=0.0005;dir=down")],
                              **SMALL))
    sim.bursts = [(30.0, 36.0, "leaf00-spine00", "up", 4.0)]
    out = tmp_path / "run.c4rec"
    sim.run(out)
    truth = load_truth(out)
    origin = clock_origin(out, truth)
    res = replay(out, measurer=SimMeasurer(sim, origin))
    assert all(i["localised"] is None for i in res.incidents), \
        [i["summary"] for i in res.incidents]


def test_a_tie_between_two_leaves_cables_is_measured(tmp_path):
    """C4P's spread can leave a link's only traffic between its two leaves, both ways: the
    ring's cross-leaf connections node001 -> node002 and node003 -> node000 both cross
    spine00, so leaf00-spine00 and leaf01-spine00 (each both ways) explain the same
    connections. No single path joins them: the tie listed no candidates and nothing was
    measured (a lab CI run named nothing in 50 s). Now the candidates are listed and the legs
    from under each leaf single out the lossy one."""
    spec = "lossy-link:leaf00-spine00@20;loss=0.01;dir=both"
    tie = dict(hosts=4, gpus_per_host=2, leaves=2, spines=2)
    sim = Simulator(SimConfig(duration=80, seed=0, noise=0.05, realism=False, **tie))
    crossing = {(c.src_host, c.dst_host, c.links[1:3]) for c in sim.jobs[0].conns
                if "leaf00-spine00" in c.links or "leaf01-spine00" in c.links}
    assert crossing == {("node001", "node002", ("leaf00-spine00", "leaf01-spine00")),
                        ("node003", "node000", ("leaf01-spine00", "leaf00-spine00"))}

    incidents, sc = run(tmp_path, spec, measure=False, seed=0, **tie)
    assert sc.named == 0 and sc.on_path == 1 and sc.false_incidents == 0, \
        [i["summary"] for i in incidents]
    assert set(incidents[0]["evidence"]["candidate_links"]) == {"leaf00-spine00",
                                                                "leaf01-spine00"}

    incidents, sc = run(tmp_path, spec, measure=True, seed=0, **tie)
    assert sc.named == 1 and sc.false_incidents == 0, [i["summary"] for i in incidents]
    [inc] = incidents
    assert inc["suspects"][0]["id"] == "leaf00-spine00"
    assert inc["evidence"]["direction"] == "both"
    # the summary names what was measured, not the tie it began as ("ambiguous")
    assert "suspect: link leaf00-spine00; measured: " in inc["summary"], inc["summary"]
    lossy = [leg for leg in inc["evidence"]["probe"]["legs"] if leg["lost"]]
    assert lossy and all(leg["crosses"] == ["leaf00-spine00"] for leg in lossy)


def test_a_lab_recording_replays_with_its_own_measurements(tmp_path):
    """20-loss-up-leaf00-spine01 (lab run O: 2 % loss one way up leaf00's cable to spine01,
    named live by the measuring probes in 24 s). Its replay asks for the same legs; the
    recorded `probe_result`s of the live run answer them (probes.RecordedMeasurer): the link is
    named from the legs, as live. Without them the replay named nothing (bench/diagnosis --lab
    scored run O's loss 1 of 4; with them 4 of 4)."""
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.diagnosis.probes import RecordedMeasurer
    from c4.core.topology import Topology
    from tests.unit.test_diag_outage import LAB, unpack

    rec, truth = unpack("20-loss-up-leaf00-spine01", tmp_path)
    topo = Topology.load(LAB / "topology.json")
    cfg = AggregatorConfig(diagnosis=truth["diagnosis"])
    named = [i for i in replay(rec, cfg=cfg, topology=topo).incidents if i["localised"]]
    assert named == []
    named = [i for i in replay(rec, cfg=cfg, topology=topo,
                               measurer=RecordedMeasurer(topo)).incidents if i["localised"]]
    assert [i["suspects"][0]["id"] for i in named] == ["leaf00-spine01"], \
        [i["summary"] for i in named]
    probe = named[0]["evidence"]["probe"]
    assert probe["named"] == "leaf00-spine01" and probe["signal"] == "loss"
    lossy = [leg for leg in probe["legs"] if leg["lost"]]
    assert lossy and all("leaf00-spine01" in leg["crosses"] for leg in lossy), probe["legs"]


def test_a_down_cable_one_leaf_reaches_its_leaf_by_is_named_from_its_leafs_legs(tmp_path):
    """21-down-leaf00-spine00-measured (the lab without eBPF tcp_flows, the ring's own ports:
    only leaf03 -> leaf00 connections entered leaf00 by spine00). The blackholed connections
    cross leaf03-spine00 and leaf00-spine00 alike: once the outage was over the tie became an
    unlocalised finding with both as candidates (outage._tie; before, nothing at all, as in
    two CI runs), and the recorded legs name the cable: every port of leaf00's leg was
    answered by spine01 (`elsewhere`), leaf03's reached spine00 (live: 16.9 s)."""
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.diagnosis.probes import RecordedMeasurer
    from c4.core.topology import Topology
    from tests.unit.test_diag_outage import LAB, unpack

    rec, truth = unpack("21-down-leaf00-spine00-measured", tmp_path)
    topo = Topology.load(LAB / "topology.json")
    cfg = AggregatorConfig(diagnosis=truth["diagnosis"])
    [tie] = replay(rec, cfg=cfg, topology=topo).incidents
    assert tie["localised"] is None and set(tie["evidence"]["candidate_links"]) == {
        "leaf00-spine00", "leaf03-spine00"}, tie["summary"]
    [inc] = replay(rec, cfg=cfg, topology=topo, measurer=RecordedMeasurer(topo)).incidents
    assert inc["localised"] is not None and inc["suspects"][0]["id"] == "leaf00-spine00", \
        inc["summary"]
    probe = inc["evidence"]["probe"]
    assert probe["named"] == "leaf00-spine00" and probe["signal"] == "down"
    assert inc["localised"] - (truth["epoch"] + truth["faults"][0]["start"]) <= 30


def test_c4_replay_measured_answers_the_probes_from_the_recording(tmp_path):
    """`c4 replay FILE --measured`: the operator's way to the replay above (fixture 21, its
    topology beside it): localised with the flag, a tie without; no topology, a clear exit 2."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.unit.test_diag_outage import unpack

    rec, truth = unpack("21-down-leaf00-spine00-measured", tmp_path)
    cfg = tmp_path / "aggregator.toml"
    cfg.write_text("[diagnosis]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                             for k, v in truth["diagnosis"].items()))

    def c4(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "c4.cli", "replay", str(rec), *args],
                              capture_output=True, text=True, timeout=120)

    plain, measured = c4("--config", str(cfg), "--json"), \
        c4("--config", str(cfg), "--measured", "--json")
    assert plain.returncode == measured.returncode == 0, plain.stderr + measured.stderr
    [tie] = json.loads(plain.stdout)["incidents"]
    [inc] = json.loads(measured.stdout)["incidents"]
    assert tie["localised"] is None
    assert inc["localised"] is not None and inc["evidence"]["probe"]["signal"] == "down"
    Path(f"{rec}.topology.json").unlink()
    bare = c4("--measured")
    assert bare.returncode == 2 and "needs its topology" in bare.stderr, bare.stderr
    assert "Traceback" not in bare.stderr


class LossyLink:
    """The agents' measurements where one cable loses `rate` of what crosses it either way
    (each datagram out and its answer back), answered `ROUND_S` after the ask: what a live
    run's agents would have returned for legs its recording never asked."""

    def __init__(self, topo, cable: str, rate: float) -> None:
        self.topo, self.cable, self.rate = topo, cable, rate
        self.due: list = []

    def measure(self, leg, count: int, now: float) -> bool:
        from c4.aggregator.diagnosis.probes import LegResult, leg_links

        crossings = sum(c.startswith(f"{self.cable}=>") for c in leg_links(self.topo, leg))
        lost = round(count * (1 - (1 - self.rate) ** crossings))
        self.due.append((now + 2.0, leg, LegResult(count, count - lost, 0.3, 0.5)))
        return True

    def results(self, now: float) -> list:
        out = [(leg, r) for t, leg, r in self.due if t <= now]
        self.due = [d for d in self.due if d[0] > now]
        return out


def test_a_ring_stalled_by_loss_is_named_by_measuring_the_stuck_pairs_cables(tmp_path):
    """22-loss-leaf00-spine00-stall (lab run S: 5 % loss both ways, C4P applying). The ring's
    connection node000 -> node002 stalled it for 29 s; the loss finding, which the probes
    resolve, ended with the data, and the hang named the host pair node000<->node002 with no
    candidates: nothing was measured and nothing named (live too), though the legs then
    measured lost 27-40 of 400 a round across the link. Now the stuck pair's cables are the
    hang's candidates, and the legs that cross the lossy one name it."""
    from c4.aggregator.config import AggregatorConfig
    from c4.core.topology import Topology
    from tests.unit.test_diag_outage import LAB, unpack

    rec, truth = unpack("22-loss-leaf00-spine00-stall", tmp_path)
    topo = Topology.load(LAB / "topology.json")
    cfg = AggregatorConfig(diagnosis=truth["diagnosis"])
    incidents = replay(rec, cfg=cfg, topology=topo).incidents
    hangs = [i for i in incidents if i["class"] == "comm_hang"]
    assert hangs and "leaf00-spine00" in hangs[0]["evidence"]["candidate_links"], \
        [(i["summary"], i["evidence"].get("candidate_links")) for i in incidents]
    incidents = replay(rec, cfg=cfg, topology=topo,
                       measurer=LossyLink(topo, "leaf00-spine00", 0.05)).incidents
    named = [i for i in incidents if i["localised"]]
    assert [i["suspects"][0]["id"] for i in named] == ["leaf00-spine00"], \
        [i["summary"] for i in incidents]
    assert named[0]["evidence"]["probe"]["named"] == "leaf00-spine00"
    onset = truth["epoch"] + truth["faults"][0]["start"]
    print(f"named {named[0]['localised'] - onset:.1f} s after the onset")


def _slow_replay(name: str, tmp_path):
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.diagnosis.probes import RecordedMeasurer
    from c4.core.topology import Topology
    from tests.unit.test_diag_outage import LAB, unpack

    rec, truth = unpack(name, tmp_path)
    topo = Topology.load(LAB / "topology.json")
    incidents = replay(rec, cfg=AggregatorConfig(diagnosis=truth["diagnosis"]), topology=topo,
                       measurer=RecordedMeasurer(topo)).incidents
    return incidents, truth["epoch"] + truth["faults"][0]["start"]


def test_a_slow_link_whose_legs_keep_the_prober_busy_is_named_within_30_s(tmp_path):
    """23-slow-leaf03-spine01-measured (lab run Y: 10 Mbit/s on a link only node005 ->
    node007 crossed, C4P not applying). The legs through it queued 38 ms and a round of one
    kept its agent's prober busy 6.5 s, so RTT, which waited for 4 rounds of each leg, named
    the link 45 s after the fault (live 45.2 s): over the 30 s target."""
    incidents, onset = _slow_replay("23-slow-leaf03-spine01-measured", tmp_path)
    named = [i for i in incidents if i["localised"]]
    assert [i["suspects"][0]["id"] for i in named] == ["leaf03-spine01"], \
        [i["summary"] for i in incidents]
    assert named[0]["evidence"]["probe"]["signal"] == "rtt"
    assert named[0]["localised"] - onset <= 30


def test_connections_paced_by_a_slow_link_name_no_other_link(tmp_path):
    """24-slow-leaf03-spine01-pace (lab run X, the same fault): from 35 s on, the ring paced
    by the slow connection moved two connections leaf01 -> leaf00 at 1.6x their load share
    for 20 reports, and the marginal rule named leaf00-spine01 (a second incident once the
    slow link was named; in the slow link's own incident while it was a path)."""
    incidents, _ = _slow_replay("24-slow-leaf03-spine01-pace", tmp_path)
    assert {i["suspects"][0]["id"] for i in incidents if i["localised"]} == \
        {"leaf03-spine01"}, [i["summary"] for i in incidents]
    assert all("leaf00-spine01" not in i["summary"] for i in incidents), \
        [i["summary"] for i in incidents]


class SlowLink(LossyLink):
    """The agents' measurements where one cable queues what crosses it (38 ms p90, lab run
    Y's tbf at 10 Mbit/s) and nothing else does (0.2 ms)."""

    def measure(self, leg, count: int, now: float) -> bool:
        from c4.aggregator.diagnosis.probes import LegResult, leg_links

        slow = any(c.startswith(f"{self.cable}=>") for c in leg_links(self.topo, leg))
        self.due.append((now + 2.0, leg, LegResult(count, count, 0.1, 38.0 if slow else 0.2)))
        return True


def test_a_tie_between_two_leaf_pairs_measures_both(tmp_path):
    """25-slow-leaf01-spine00-tie (lab run Z: leaf01-spine00 at 10 Mbit/s, C4P not applying).
    node002 and node003 counted loss on receive; each receives from leaf00 through spine01
    (0->2, 1->3) and from leaf02 through spine00 (5->2, 4->3, the slowed ones), so
    leaf01-spine00 explains them exactly as well as the two cables to spine01 together. Only
    those two were candidates: the legs measured them, found nothing, and the link was
    named 34.5 s after the fault (by the outage detector). Every link tied with the top is
    a candidate now."""
    from c4.aggregator.config import AggregatorConfig
    from c4.core.topology import Topology
    from tests.unit.test_diag_outage import LAB, unpack

    rec, truth = unpack("25-slow-leaf01-spine00-tie", tmp_path)
    topo = Topology.load(LAB / "topology.json")
    incidents = replay(rec, cfg=AggregatorConfig(diagnosis=truth["diagnosis"]), topology=topo,
                       measurer=SlowLink(topo, "leaf01-spine00", 0.0)).incidents
    named = [i for i in incidents if i["localised"]]
    assert [i["suspects"][0]["id"] for i in named] == ["leaf01-spine00"], \
        [i["summary"] for i in incidents]
    assert named[0]["localised"] - (truth["epoch"] + truth["faults"][0]["start"]) <= 30


class FlappingLink(LossyLink):
    """The agents' measurements where one cable flaps: down `down_s` of every `period_s`
    from `onset` (replay clock). A round sends its datagrams at the agent's pace from the
    ask; one sent in a down phase is answered by the other spine (its leaf drops the dead
    nexthop at once), which the leg does not count."""

    def __init__(self, topo, cable: str, onset: float, period_s: float, down_s: float) -> None:
        super().__init__(topo, cable, 0.0)
        self.onset, self.period_s, self.down_s = onset, period_s, down_s

    def measure(self, leg, count: int, now: float) -> bool:
        from c4.agent.probe import MEASURE_PPS
        from c4.aggregator.diagnosis.probes import LegResult, leg_links

        crosses = any(c.startswith(f"{self.cable}=>") for c in leg_links(self.topo, leg))
        lost = sum(1 for i in range(count) if crosses and now + i / MEASURE_PPS >= self.onset
                   and (now + i / MEASURE_PPS - self.onset) % self.period_s < self.down_s)
        self.due.append((now + count / MEASURE_PPS, leg,
                         LegResult(count, count - lost, 0.1, 0.2)))
        return True


def test_measuring_rounds_do_not_alias_with_a_flap(tmp_path):
    """29-flap-leaf00-spine01-measured-aliased (bench/lab, 2026-12-08, C4P applying): every
    connection that timed out crossed node000's cable and leaf00-spine01, a tie the legs
    had to separate; the live legs measured 400 of 400 in every round for 30 s and nothing
    was named. The flap (1 s down in every 4.3 s, its phase log in a rerun) fell between
    rounds asked 4 or 5 s apart: the gaps, spread over 3-5 s by a fixed sequence, came to
    the aggregator's 1 s ticks as 5, 4, 5, 4, 4, 5, ... and held the rounds' phase in the
    flap's up phases. Gaps drawn per leg and round over 2-6 s sample every phase."""
    from c4.aggregator.config import AggregatorConfig
    from c4.core.topology import Topology
    from tests.unit.test_diag_outage import LAB, unpack

    rec, truth = unpack("29-flap-leaf00-spine01-measured-aliased", tmp_path)
    topo = Topology.load(LAB / "topology.json")
    onset = truth["epoch"] + truth["faults"][0]["start"]
    incidents = replay(rec, cfg=AggregatorConfig(diagnosis=truth["diagnosis"]), topology=topo,
                       measurer=FlappingLink(topo, "leaf00-spine01", onset, 4.3, 1.0)).incidents
    named = [i for i in incidents if i["localised"]]
    assert [i["suspects"][0]["id"] for i in named] == ["leaf00-spine01"], \
        [i["summary"] for i in incidents]
    assert named[0]["evidence"]["probe"]["named"] == "leaf00-spine01"
    print(f"named {named[0]['localised'] - onset:.1f} s after the onset")

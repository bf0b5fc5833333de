"""C4D on syndromes that do not share its assumptions (issue 13), end to end through `c4 sim`
and the real replay: start-up and checkpoints that are not hangs, one-direction faults, links
crossed by one connection, marginal slow NICs and low packet loss."""
from __future__ import annotations

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.replay import replay
from c4.lab.evaluate import clock_origin, load_truth, score
from c4.lab.sim import Fault, SimConfig, Simulator

SMALL = dict(hosts=4, gpus_per_host=4, leaves=4, spines=2)


def replayed(tmp_path, sim: Simulator, **diagnosis):
    out = tmp_path / "run.c4rec"
    sim.run(out)
    res = replay(out, cfg=AggregatorConfig(diagnosis=diagnosis) if diagnosis else None)
    truth = load_truth(out)
    return res, score(truth, res.incidents, clock_origin(out, truth))


def test_a_host_slow_to_start_is_no_hang(tmp_path):
    """node003 loads data for 30 s after init while the others wait in the first collective."""
    sim = Simulator(SimConfig(duration=60, seed=3, realism=False, **SMALL))
    inc = sim.jobs[0].incs[0]
    inc.ready["node003"] += 30.0
    inc.ops_start = inc.knots[0][0] + 30.0
    inc.knots = [(inc.ops_start, 0.0, 0.0)]
    res, _ = replayed(tmp_path, sim)
    assert res.incidents == [], [i["summary"] for i in res.incidents]


def test_a_checkpoint_inside_a_collective_is_no_hang(tmp_path):
    """Rank 0 writes for 25 s while every other rank waits for it in the next collective."""
    sim = Simulator(SimConfig(duration=70, seed=4, realism=False, **SMALL))
    sim.pauses = [Fault("hang", "0", 20.0, 45.0)]
    res, _ = replayed(tmp_path, sim)
    assert res.incidents == [], [i["summary"] for i in res.incidents]


def test_checkpoint_length_is_learned(tmp_path):
    """Declared 10 s: the first 15 s pause is a hang (as declared); the job recovered from it,
    so the next, 20 s long, is within what its checkpoints take."""
    sim = Simulator(SimConfig(duration=100, seed=5, realism=False, **SMALL))
    sim.pauses = [Fault("hang", "0", 20.0, 35.0), Fault("hang", "0", 60.0, 80.0)]
    res, _ = replayed(tmp_path, sim, checkpoint_s=10.0)
    assert len(res.incidents) == 1, [i["summary"] for i in res.incidents]
    assert res.incidents[0]["class"] == "noncomm_hang"
    assert res.incidents[0]["evidence"]["pause_allowance_s"] == 10.0


def test_idle_tcp_sockets_of_a_plugin_job_are_no_hang(tmp_path):
    """An NCCL job's store and bootstrap sockets (tcp_flows, with its processes in the owners)
    carry a few KB at init and nothing after: the plugin reports the job, the TCP detector
    must not read two minutes of idle sockets as a hang (it did). The agent listed them once:
    they still count for the job (GET /jobs said 0)."""
    sim = Simulator(SimConfig(duration=130, seed=3, **SMALL))
    res, _ = replayed(tmp_path, sim)
    assert res.incidents == [], [i["summary"] for i in res.incidents]
    [job] = res.jobs
    assert job["flows"] == 3 * 4 + 4  # 12 ranks off node000 to its store, 4 bootstrap hops


def test_a_rank_its_agent_sees_stopped_is_named_within_seconds(tmp_path):
    """SIGSTOP inside a collective: the agent's owners show the rank's process `T` (its
    store socket is tracked). Nothing legitimate stops a training process, so it is named
    once a peer has waited an interval, not at the plugin's stall threshold (5-6 s before)."""
    sim = Simulator(SimConfig(duration=45, seed=3, faults=[Fault.parse("sigstop:6@20")],
                              **SMALL))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    assert sc.localise_s[0] <= 3.5
    [inc] = res.incidents
    assert inc["evidence"]["stopped_ranks"] == [6] and "is stopped (T" in inc["summary"]


def test_a_rank_that_stops_is_named_after_the_checkpoint_allowance(tmp_path):
    sim = Simulator(SimConfig(duration=100, seed=6, realism=False,
                              faults=[Fault("hang", "5", 15.0)], **SMALL))
    _, sc = replayed(tmp_path, sim)
    assert sc.named == 1, sc.misses
    assert 60.0 <= sc.localise_s[0] <= 70.0


def crossings(seed: int, **cfg) -> dict[tuple[str, str], int]:
    """(fabric link, up | down) -> connections of the job crossing it that way."""
    job = Simulator(SimConfig(**cfg, seed=seed, realism=False)).jobs[0]
    out: dict[tuple[str, str], int] = {}
    for c in job.conns:
        for i, lk in enumerate(c.links[1:-1]):
            key = (lk, "up" if i == 0 else "down")
            out[key] = out.get(key, 0) + 1
    return out


TREE = dict(hosts=8, gpus_per_host=4, leaves=4, spines=2, collective="tree")


def test_a_link_slow_one_way_is_named_with_its_direction(tmp_path):
    """The other direction's healthy connections must not clear it. (A tree: several host
    pairs cross each fabric link; in a ring only one does, see the next test.)"""
    n = crossings(7, **TREE)
    link = max(sorted({lk for lk, _ in n}), key=lambda lk: min(n.get((lk, "up"), 0),
                                                                 n.get((lk, "down"), 0)))
    sim = Simulator(SimConfig(duration=45, seed=7, realism=False, **TREE,
                              faults=[Fault.parse(f"slow-fabric:{link}@10;x=2.5;dir=up")]))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    spine = link.split("-")[1]
    assert res.incidents[0]["evidence"]["direction"] == f"towards {spine}"


def test_a_link_one_connection_crosses_is_named_as_its_path(tmp_path):
    """Its NICs, cables and fabric links cannot be told apart: the path, with the candidate
    links and a confidence that does not act. (In a ring, each direction of a fabric link
    carries one host pair's connections: the up link at one end and the down link at the
    other explain them equally.)"""
    two = dict(hosts=4, gpus_per_host=2, leaves=4, spines=2)  # two connections per host pair
    lone = sorted(k for k, n in crossings(8, **two).items() if n == 1)
    link, d = lone[0]
    sim = Simulator(SimConfig(duration=45, seed=8, realism=False, **two,
                              faults=[Fault.parse(f"slow-fabric:{link}@10;x=3;dir={d}")]))
    res, sc = replayed(tmp_path, sim)
    (inc,) = res.incidents
    top = inc["suspects"][0]
    assert top["kind"] == "path" and top["confidence"] < 0.5 and inc["localised"] is None
    assert link in inc["evidence"]["candidate_links"]
    assert sc.false_isolations == 0


def test_low_loss_one_way_is_found_from_the_nic_counters(tmp_path):
    """0.1 % loss up one fabric link slows its connections by 6 %, far below any slow
    threshold; the NIC counters (the receivers' out-of-sequence counts, loss.py, or the
    senders' ACK timeouts, outage.py, whichever names it first) name the link and its
    direction."""
    n = crossings(9, **TREE)
    link = max(sorted({lk for lk, _ in n}), key=lambda lk: n.get((lk, "up"), 0))
    sim = Simulator(SimConfig(duration=45, seed=9, realism=False, **TREE,
                              faults=[Fault.parse(f"lossy-link:{link}@10;loss=0.001;dir=up")]))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    ev = res.incidents[0]["evidence"]
    assert ev["direction"] == f"towards {link.split('-')[1]}"
    assert (ev.get("loss_counters") or ev.get("ack_timeout_reports")) and \
        sc.localise_s[0] <= 30.0


def test_a_nic_at_85_percent_of_its_rate_is_named(tmp_path):
    """x1.18: every report of its connections is within the per-report noise threshold; the
    median of their last reports is not."""
    sim = Simulator(SimConfig(duration=60, seed=10, noise=0.05, realism=False, **SMALL,
                              faults=[Fault.parse("slow-node:node002/mlx5_1@10;x=1.18")]))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    assert res.incidents[0]["evidence"]["marginal_reports"] >= 10


def test_marginal_slowness_stays_quiet_on_a_noisy_clean_run(tmp_path):
    sim = Simulator(SimConfig(duration=900, seed=11, noise=0.1, interval=2.0, **SMALL))
    res, _ = replayed(tmp_path, sim)
    assert res.incidents == [], [i["summary"] for i in res.incidents]


def test_low_loss_on_a_tcp_job_is_found_from_its_retransmits(tmp_path):
    """0.1 % loss one way, a job without the plugin: about 0.7 retransmitted segments per MB
    on the connections crossing it, 70 times the clean rate."""
    cfg = dict(hosts=8, gpus_per_host=1, leaves=4, spines=2, transport="tcp")
    n = crossings(12, **cfg)
    link = max(sorted({lk for lk, _ in n}), key=lambda lk: n.get((lk, "up"), 0))
    sim = Simulator(SimConfig(duration=45, seed=12, realism=False, **cfg,
                              faults=[Fault.parse(f"lossy-link:{link}@10;loss=0.001;dir=up")]))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    assert res.incidents[0]["evidence"]["metrics"]["retrans_per_mb"]["slow"] < 1.0


def test_a_marginal_nic_is_named_beside_a_slow_link(tmp_path):
    """The marginal test waits while a connection of the job is slow per report (it sets the
    job's pace: docs/diagnosis.md, fixture 24-slow-leaf03-spine01-pace), so the NIC is named
    once the link is healed. Before, the slow link's own reports stayed in its connections'
    20-report medians after the heal, and the marginal rule renamed its incident host:node002
    (the link's 4 connections and one more through that host)."""
    sim = Simulator(SimConfig(duration=90, seed=13, noise=0.05, realism=False, **SMALL,
                              faults=[Fault.parse("slow-node:node003/mlx5_2@10;x=1.2"),
                                      Fault.parse("slow-link:node001,node002@10-40;x=3")]))
    _, sc = replayed(tmp_path, sim)
    assert sc.named == 2 and sc.false_incidents == 0, (sc.misses, sc.wrong)


def test_jobs_sharing_hosts_a_dead_nic_is_the_job_that_uses_it(tmp_path):
    """Two jobs on every host, each on its own GPUs and their NICs: node001/mlx5_3 belongs to
    the second job, whose hang is that NIC's (one incident), not to the host's first job."""
    sim = Simulator(SimConfig(duration=50, seed=3, realism=False, jobs=2, share_hosts=True,
                              faults=[Fault.parse("nic-down:node001/mlx5_3@20")], **SMALL))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    (inc,) = res.incidents
    assert inc["job"] == load_truth(tmp_path / "run.c4rec")["faults"][0]["job"] == "train-1"
    assert inc["evidence"]["jobs_on_host"] == ["train-0", "train-1"]


def test_a_straggler_does_not_hide_a_slow_nic_on_its_host(tmp_path):
    """Rank 9 (node002) arrives late at every collective; two seconds later node002/mlx5_3
    runs at 85 %. Two culprits of one tier on one host are two faults: the NIC's incident is
    its own, not a symptom of the straggler's."""
    sim = Simulator(SimConfig(duration=70, seed=5, noise=0.05, straggler_delay=0.1,
                              realism=False, **SMALL,
                              faults=[Fault.parse("straggler:9@20"),
                                      Fault.parse("slow-node:node002/mlx5_3@22;x=1.18")]))
    _, sc = replayed(tmp_path, sim)
    assert sc.named == 2 and sc.false_incidents == 0, (sc.misses, sc.wrong)


def test_a_rank_sharing_the_stragglers_peers_is_not_a_straggler(tmp_path):
    """Ranks 0 and 10 have the same ring neighbours (5, 15): while 0 straggles, they wait at
    every collective and 10 does not, the straggler's own pattern. Collective times as long as
    everyone's clear 10, but the check read only the current report: one short one (87.9 s)
    opened a second straggler incident (issue 13's corpus, two faults at once)."""
    sim = Simulator(SimConfig(duration=131.7, seed=504104335, noise=0.05, slowdown=3.71,
                              straggler_delay=0.14, **SMALL,
                              faults=[Fault.parse("slow-node:node000/mlx5_1@21.7;x=1.18"),
                                      Fault.parse("straggler:0@29.43")]))
    _, sc = replayed(tmp_path, sim)
    assert sc.named == 2 and sc.false_incidents == 0, (sc.misses, sc.wrong)


def test_a_rank_idle_where_checkpoints_were_always_written_by_another_is_named_at_once(tmp_path):
    """Rank 0 wrote the job's two checkpoints (the others waited for it in the next
    collective); then rank 5 stops calling collectives: not a checkpoint writer, named after
    the hang threshold rather than the 60 s allowance."""
    sim = Simulator(SimConfig(duration=85, seed=6, realism=False,
                              faults=[Fault("hang", "5", 60.0)], **SMALL))
    sim.pauses = [Fault("hang", "0", 15.0, 25.0), Fault("hang", "0", 35.0, 45.0)]
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    assert sc.localise_s[0] <= 10.0
    assert res.incidents[0]["evidence"]["checkpoint_writers"] == [0]


def test_checkpoints_by_varying_ranks_teach_no_writers(tmp_path):
    sim = Simulator(SimConfig(duration=80, seed=6, realism=False, **SMALL))
    sim.pauses = [Fault("hang", "0", 15.0, 25.0), Fault("hang", "4", 35.0, 45.0),
                  Fault("hang", "8", 55.0, 70.0)]
    res, _ = replayed(tmp_path, sim)
    assert res.incidents == [], [i["summary"] for i in res.incidents]


def test_a_rank_stopped_late_in_a_pipelined_ring_is_named_not_the_ranks_waiting(tmp_path):
    """The lab's syndrome (issue 13): rank 3 stopped late inside op W; its ring successor had
    all it needed, finished W and waits in W + 1. The others, still in W, are not behind:
    one incident names node003 within the hang target."""
    sim = Simulator(SimConfig(duration=45, seed=3, realism=False, hosts=8, gpus_per_host=1,
                              leaves=4, spines=2, faults=[Fault.parse("sigstop:3@15;ahead=1")]))
    res, sc = replayed(tmp_path, sim)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    assert sc.localise_s[0] <= 10.0
    assert res.incidents[0]["evidence"]["ahead_ranks"] == [4]


def test_two_tenant_bursts_a_report_apart_on_one_link_are_no_slow_link(tmp_path):
    """Other tenants' congestion on one direction of a fabric link, 3.7 s at 3.5x and 3.8 s at
    3.1x, 3.4 s apart: slow in 3 of every 4 reports over more than slow_hold_s, but with a
    break between (a clean hour of the bench localised it to the link)."""
    sim = Simulator(SimConfig(duration=90, seed=1, realism=False, interval=2.0,
                              collective="tree", **SMALL))
    use: dict[tuple[str, str], int] = {}
    for c in sim.jobs[0].conns:
        for i, lk in enumerate(c.links[1:-1]):
            key = (lk, "up" if i == 0 else "down")
            use[key] = use.get(key, 0) + 1
    (link, way), crossing = max(use.items(), key=lambda kv: kv[1])
    assert crossing >= 3  # connections enough to name the link, were it broken
    sim.bursts = [(40.1, 43.8, link, way, 3.5), (47.2, 51.0, link, way, 3.1)]
    res, _ = replayed(tmp_path, sim)
    assert res.incidents == [], [i["summary"] for i in res.incidents]

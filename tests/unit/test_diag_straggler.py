"""Stragglers (aggregator/diagnosis/straggler.py): the rank that arrives last at every
collective, on the lab's ring and in the incident layer."""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.findings import Finding, Suspect
from c4.aggregator.diagnosis.incidents import Incidents
from c4.aggregator.diagnosis.model import Comm, Rank
from c4.aggregator.diagnosis.straggler import StragglerDetector
from tests.unit.test_diag_outage import named_after, run, unpack


def test_a_cpu_starved_rank_on_the_labs_ring_is_named_in_seconds(tmp_path: Path) -> None:
    """07-straggler-6 (bench/lab --kinds straggler, 2026-12-01): rank 6's cgroup gets 2 % of
    a CPU 7.8 s in. On a ring every rank waits for it (its 4 peers are half the job, so their
    entry waits are the median's and the wait rule never fired); only its collectives are
    short (0.6-0.75 s, the others' 0.8-1.1 s). Before: named only by the marginal slow rule
    over 20 reports, its host 52 s in (past this 40 s recording), with a second incident."""
    name = "07-straggler-6"
    rec, truth = unpack(name, tmp_path)
    incidents = run(rec, truth)
    assert len(incidents) == 1, [i["summary"] for i in incidents]
    after = named_after(incidents, truth)
    assert set(after) <= {"6", "node006"} and after, incidents[0]["summary"]
    assert max(after.values()) <= 15.0, after


def _comm(ops: dict[int, float], ew: float = 0.05) -> Comm:
    comm = Comm("00000000000000aa", "job", len(ops), 0.0)
    for r, op in ops.items():
        rk = Rank(r, f"node{r:03d}")
        rk.ew, rk.op, rk.fresh, rk.seen = ew, op, True, 0.0
        rk.peers = {(r - 1) % len(ops), (r + 1) % len(ops)}
        comm.ranks[r] = rk
    return comm


def _judge(ops: dict[int, float], reports: int = 6) -> list[Finding]:
    det, comm, out = StragglerDetector(DiagnosisConfig()), _comm(ops), []
    for t in range(reports):
        for rk in comm.ranks.values():
            rk.seen = float(t)  # a report from every rank each interval
        out += det.tick(comm, float(t))
    return out


def test_the_rank_whose_collectives_are_clearly_shortest_is_the_straggler() -> None:
    ops = {r: 0.9 + 0.01 * (r % 3) for r in range(8)}
    ops[6] = 0.6
    (f, *_) = _judge(ops)
    assert f.cls == "noncomm_slow" and f.top is not None and f.top.id == "6"
    assert f.evidence["others_median_op_time_s"] > 0.9


def test_collectives_short_by_less_than_the_share_or_the_spread_name_nobody() -> None:
    near = {r: 1.0 for r in range(8)}
    near[6] = 0.9  # 10 % short: ordinary skew, not someone everyone waits for
    assert _judge(near) == []
    wide = {r: 0.6 + 0.1 * r for r in range(8)}  # the others spread 0.7-1.3 s
    wide[0] = 0.45
    assert _judge(wide) == []


def _incidents(tmp_path: Path) -> Incidents:
    return Incidents(sqlite3.connect(tmp_path / "i.db"), DiagnosisConfig(), None,
                     logging.getLogger("test"))


def _straggler(now: float) -> Finding:
    return Finding("noncomm_slow", "job", "00000000000000aa",
                   [Suspect("rank", "6", "node006", 6, 0.95)], "rank 6 arrives last", {}, now)


def _slow_host(now: float) -> Finding:
    return Finding("comm_slow", "job", "00000000000000aa",
                   [Suspect("host", "node006", "node006", None, 0.95)], "node006 slow", {}, now)


def test_a_straggler_and_its_hosts_slow_connections_are_one_incident(tmp_path: Path) -> None:
    """A CPU-starved rank arrives late and its host moves data slowly: two detectors name the
    rank and its host, in either order. Before: two incidents of one tier on one host were
    always two faults (the rule meant for a straggler beside a slow NIC)."""
    for first, second in ((_straggler, _slow_host), (_slow_host, _straggler)):
        (tmp_path / first.__name__).mkdir()
        inc = _incidents(tmp_path / first.__name__)
        a = inc.report(first(0.0), 0.0)
        inc.report(first(1.0), 1.0)
        b = inc.report(second(2.0), 2.0)
        assert a.id == b.id and len(inc.open()) == 1


def test_the_path_into_a_straggler_named_first_is_the_straggler(tmp_path: Path) -> None:
    """A CI run of the lab's straggler test (2026-12-01): rank 6 starved of CPU stopped reading,
    the connection into it (4->6, 16x the job's time per byte) was named as its path
    node004/mlx5_0->node006/mlx5_0 (0.14, not localised) before the straggler was, and stayed
    open beside it. A path that ends at the host named later is the same fault: merged into
    it. A path between other hosts is not."""
    def path(sid: str, comm: str, now: float) -> Finding:
        return Finding("comm_slow", "job", comm, [Suspect("path", sid, None, None, 0.14)],
                       "1 connection slow", {}, now)

    inc = _incidents(tmp_path)
    into = inc.report(path("node004/mlx5_0->node006/mlx5_0", "00000000000000aa", 0.0), 0.0)
    other = inc.report(path("node001/mlx5_0->node002/mlx5_0", "00000000000000bb", 0.5), 0.5)
    named = inc.report(_straggler(1.0), 1.0)
    assert {i.id for i in inc.open()} == {named.id, other.id}
    assert inc.get(into.id)["evidence"]["merged_into"] == named.id


def test_a_straggler_and_a_slow_nic_on_its_host_stay_two_incidents(tmp_path: Path) -> None:
    inc = _incidents(tmp_path)
    nic = Finding("comm_slow", "job", "00000000000000aa",
                  [Suspect("nic", "node006/mlx5_1", "node006", None, 0.95)], "NIC slow", {}, 0.0)
    a = inc.report(nic, 0.0)
    inc.report(nic, 1.0)
    b = inc.report(_straggler(2.0), 2.0)
    assert a.id != b.id and len(inc.open()) == 2


def test_a_slow_host_and_a_lossy_link_of_one_job_stay_two_incidents(tmp_path: Path) -> None:
    """tests/e2e/test_sim_replay.py's 2,048 ranks (CI, 2026-12-01): an unlocalised finding of
    each opened one incident (one symptom per communicator), the lossy link's candidates
    among its keys; once both were named, the host's finding met the link's incident under
    the host's key and joined it: node010 was never named. The host-and-part rule is for a
    host and a rank or NIC on it, not any incident that holds the host's key."""
    inc = _incidents(tmp_path)
    comm = "00000000000000aa"
    path = Finding("comm_slow", "job", comm, [Suspect("path", "node031->node032", None, None,
                                                      0.46)], "loss on a path",
                   {"candidate_links": {"leaf01-spine03": "both"}}, 0.0)
    link = Finding("comm_slow", "job", comm, [Suspect("link", "leaf01-spine03", None, None,
                                                      1.0)], "lossy link", {}, 0.0)
    host = _slow_host(0.0)
    inc.report(path, 0.0)
    for t in (1.0, 2.0, 3.0):
        inc.report(host, t)
        inc.report(link, t)
    named = sorted(i.suspects[0]["id"] for i in inc.open())
    assert named == ["leaf01-spine03", "node006"], named

"""Which QPs go into each report: changed first, then the rest in turn, within a budget."""
from __future__ import annotations

from c4.agent.collectors.verbs_qp import QpReporter


def qp(n: int, state: str = "RTS", destroyed: bool = False) -> dict:
    return {"lqpn": n, "state": state, "destroyed": destroyed}


def table(n: int) -> dict:
    return {(1, i): qp(i) for i in range(n)}


def test_everything_new_is_sent_once_then_refreshed_in_turn() -> None:
    r = QpReporter(budget=4)
    entries = table(10)
    seen: list[int] = []
    deferred = []
    for _ in range(3):  # 10 new QPs need 3 reports of 4
        qps, d, done = r.select(entries)
        seen += [q["lqpn"] for q in qps]
        deferred.append(d)
        assert done == []
    assert sorted(set(seen)) == list(range(10))
    assert deferred == [6, 2, 0]
    # nothing changed: unchanged QPs are repeated round-robin, every one within 3 reports
    refreshed = []
    for _ in range(3):
        qps, d, _ = r.select(entries)
        refreshed += [q["lqpn"] for q in qps]
        assert d == 0
    assert set(refreshed) == set(range(10))


def test_a_change_goes_before_refreshes() -> None:
    r = QpReporter(budget=3)
    entries = table(6)
    r.select(entries)
    r.select(entries)
    entries[(1, 4)] = qp(4, state="ERR")
    qps, deferred, _ = r.select(entries)
    assert qps[0] == qp(4, state="ERR") and len(qps) == 3 and deferred == 0


def test_destroyed_qps_are_reported_once_and_returned_for_eviction() -> None:
    r = QpReporter(budget=10)
    entries = table(3)
    r.select(entries)
    entries[(1, 1)] = qp(1, destroyed=True)
    qps, _, done = r.select(entries)
    assert done == [(1, 1)]
    assert qp(1, destroyed=True) in qps
    del entries[(1, 1)]  # the collector evicts it from the map
    qps, _, done = r.select(entries)
    assert done == [] and all(not q["destroyed"] for q in qps)


def test_deferred_destruction_is_not_lost() -> None:
    r = QpReporter(budget=1)
    entries = {(1, 1): qp(1, destroyed=True), (1, 2): qp(2, destroyed=True)}
    first, d1, done1 = r.select(entries)
    assert d1 == 1 and len(done1) == 1
    del entries[done1[0]]
    second, d2, done2 = r.select(entries)
    assert d2 == 0 and done2 == [k for k in entries]
    assert {q["lqpn"] for q in first + second} == {1, 2}

"""A job that restarts or ends is no hang (issue 13, the clean corpus's seed 2): its processes
exit host by host, a second or so apart, and for a report or two the ranks of the hosts that
exited first are gone while the others still report waiting, here inside a collective that a
checkpoint writer (rank 0, idle and writing) holds past the hang threshold. A crash, one host's
processes gone while the rest of the job waits on, is still named, and so is a stopped rank
whose agent dropped its frozen summary."""
from __future__ import annotations

from typing import Any

from c4.aggregator.diagnosis import hang
from tests.unit.test_diag_hang import CULPRIT, GPUS, N, PluginRing, host_of, named

WRITER = 0  # on h0: writes the checkpoint while the others wait for it inside a collective
WRITING = (0.4, 200 << 20)  # its process serialises and writes: CPU s/s, bytes/s


def checkpoint_inside(seconds: int) -> PluginRing:
    """A ring with a 60 s checkpoint allowance, 10 collectives a second (hang threshold 5 s),
    whose WRITER stopped calling collectives to write a checkpoint `seconds` ago while every
    other rank entered the next one and waits in it."""
    ring = PluginRing(completed=0, checkpoint_s=60.0, owners=True)
    ring.healthy(20)
    ring.use[WRITER] = WRITING
    for age in range(1, seconds + 1):
        ring.report(waiting(ring, float(age)))
    assert ring.diag.incidents() == []  # past the threshold, within the allowance
    return ring


def waiting(ring: PluginRing, age: float) -> dict[int, dict[str, Any] | None]:
    k = ring.done
    out: dict[int, dict[str, Any] | None] = {
        r: ring.summary(r, k + 1, k, inflight_age=age) for r in range(N)}
    out[WRITER] = ring.summary(WRITER, k, k)
    return out


def report(ring: PluginRing, summaries: dict[int, dict[str, Any] | None],
           procs: dict[int, str | None]) -> None:
    """One report per host, then a tick: `summaries` as PluginRing.report (None: not listed);
    each rank's process in its host's owners in state procs[r] (None: not listed, its
    process and its sockets gone)."""
    for h in ring.seq:
        ranks = [r for r in range(N) if host_of(r) == h]
        owners = []
        for r in ranks:
            if procs[r] is not None:
                owners.append(dict(ring._owner(r), state=procs[r]))
        ring._send(h, "report", {
            "interval": 1.0, "health": {},
            "nccl": {"comms": [s for r, s in sorted(summaries.items())
                               if s is not None and r in ranks]},
            "tcp_flows": {"flows": [], "omitted": 0, "tracked": 0, "map_full": 0,
                          "drops": {}, "drops_delta": {}, **({"owners": owners} if owners else {})}})
    ring.diag.tick(ring.t)
    ring.t += 1.0


def test_a_restart_during_a_checkpoint_inside_a_collective_is_no_hang() -> None:
    """The seed-2 event: h2's processes exit first (its host reports without them), h1's a
    report later, h0's and h3's the one after; the next incarnation is another communicator.
    Before the fix h2 was named ("stopped reporting") and h0 ("never entered": the writer)."""
    ring = checkpoint_inside(12)
    exited: set[str] = set()
    for i, hosts in enumerate((("h2",), ("h1",), ("h0", "h3"))):
        exited.update(hosts)
        out = waiting(ring, 13.0 + i)
        procs: dict[int, str | None] = {r: "S" for r in range(N)}
        for r in range(N):
            if host_of(r) in exited:
                out[r] = procs[r] = None
        report(ring, out, procs)
    for _ in range(15):  # the old communicator's hosts report nothing of it until it expires
        report(ring, {}, {r: None for r in range(N)})
    assert ring.diag.incidents() == []


def test_a_killed_job_whose_processes_the_agent_reads_gone_is_no_hang() -> None:
    """Killed, not finalized: the agent repeats each process's last summary (the plugin sent
    no final one), and reads the process gone (`X`) in its owners while its sockets are still
    tracked. h2 is killed first, the other hosts a report later."""
    ring = checkpoint_inside(12)
    frozen = waiting(ring, 12.0)
    killed: set[str] = set()
    for i, hosts in enumerate((("h2",), ("h2",), ("h0", "h1", "h3"), ("h0", "h1", "h3"))):
        killed.update(hosts)
        out = waiting(ring, 13.0 + i)
        procs: dict[int, str | None] = {r: "S" for r in range(N)}
        for r in range(N):
            if host_of(r) in killed:
                out[r], procs[r] = frozen[r], "X"
        report(ring, out, procs)
    assert ring.diag.incidents() == []


def test_a_crash_during_a_checkpoint_is_named_once_the_others_keep_waiting() -> None:
    """Only h2's processes exit; every other rank keeps waiting: a crash, named a few report
    intervals after the exit (hang.EXIT_INTERVALS), not at once; alone: the writer, still
    within its checkpoint allowance, is no culprit (before: h0 named with it)."""
    ring = checkpoint_inside(12)
    gone = ring.t
    crashed = [r for r in range(N) if host_of(r) == "h2"]
    for i in range(8):
        out = waiting(ring, 13.0 + i)
        procs: dict[int, str | None] = {r: "S" for r in range(N)}
        for r in crashed:
            out[r] = procs[r] = None
        report(ring, out, procs)
    (inc,) = ring.diag.incidents()
    assert inc["class"] == "noncomm_hang" and inc["suspects"][0]["id"] == "h2"
    assert inc["evidence"]["missing_ranks"] == crashed and len(crashed) == GPUS
    assert hang.EXIT_INTERVALS <= inc["localised"] - gone <= hang.EXIT_INTERVALS + 1


def test_a_stopped_rank_its_agent_drops_is_still_named() -> None:
    """SIGSTOP inside a collective: the agent repeats the frozen summary, then drops it (its
    stale_intervals) and its host reports without it. That rank stopped before it was dropped:
    no pause for a restart, the incident is updated at every evaluation (before: none for
    hang.EXIT_INTERVALS)."""
    ring = PluginRing(completed=0)
    ring.healthy(20)
    ring.hang(8, "frozen")
    inc = named(ring)
    k = ring.done
    for age in range(9, 13):
        out: dict[int, dict[str, Any] | None] = {
            r: ring.summary(r, k + 1, k, inflight_age=float(age)) for r in range(N)}
        out[CULPRIT] = None
        ring.report(out)
        (inc,) = ring.diag.incidents()
        assert inc["updated"] == ring.t - 1.0 and CULPRIT in inc["evidence"]["missing_ranks"]

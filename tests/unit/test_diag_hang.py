"""Hang localisation on data in the NCCL plugin's form (c4/core/ordinals.py: counts
`seq_started`/`seq_completed`, 0-based ordinals in `inflight.seq` and `nccl_stall.seq`), fed
frame by frame into Diagnosis: a rank stopped between collectives, inside one (its summaries
stop, or the agent repeats its last one), one that exited, one stuck in a kernel while its
plugin still reports, the first collective (ordinal 0) and a communicator that just started."""
from __future__ import annotations

import logging
import sqlite3
from typing import Any

import pytest

from c4.aggregator.diagnosis import Diagnosis, DiagnosisConfig, hang
from c4.core import ordinals
from c4.core.wire import Frame, kinds

COMM = "00000000000000c4"
HOSTS, GPUS = 4, 2
N = HOSTS * GPUS
OPS = 10  # collectives per interval while healthy
CULPRIT = 5  # on h2


def host_of(r: int) -> str:
    return f"h{r // GPUS}"


def comm_summary(comm: str, job: str, nranks: int, gpus: int, r: int, started: int,
                 completed: int, ops: int = 0, age: float | None = None) -> dict[str, Any]:
    """Rank r's summary as the plugin sends it: `ops` AllReduces completed this interval, the
    oldest incomplete op in flight for `age` seconds."""
    s: dict[str, Any] = {
        "comm": comm, "rank": r, "nranks": nranks, "seq_started": started,
        "seq_completed": completed, "pid": 1000 + r, "job": job, "dev": r % gpus,
        "colls": [], "peers": [], "inflight": None}
    if ops:
        s["colls"] = [{"func": "AllReduce", "count": ops, "bytes": ops << 20,
                       "time_s": 0.02 * ops}]
    oldest = ordinals.oldest_incomplete(started, completed)
    if oldest is not None:
        s["inflight"] = {"seq": oldest, "func": "AllReduce", "age_s": age,
                         "progress_age_s": age}
    return s


class PluginRing:
    """A ring AllReduce job as the plugin + agent report it, one report per host per second."""

    def __init__(self, completed: int, checkpoint_s: float = 0.0,
                 owners: bool = False) -> None:
        self.db = sqlite3.connect(":memory:")
        # naming, not waiting: no checkpoint allowance or start-up grace unless asked (see
        # test_diag_adversarial.py for those)
        self.diag = Diagnosis.from_config(
            self.db, DiagnosisConfig(checkpoint_s=checkpoint_s, startup_grace_s=0.0), None,
            None, logging.getLogger("t"))
        self.done = completed  # collectives every rank completed before the fault
        self.seq = {f"h{i}": 0 for i in range(HOSTS)}
        self.t = 100.0
        self.frozen: dict[int, dict[str, Any]] = {}  # rank -> summary the agent repeats
        # `owners`: each host's tcp_flows lists its ranks' processes with their counters
        # (cpu_s, written; None: the agent cannot read them), which advance each second by
        # `use` (rank -> CPU seconds, bytes), 1.2 CPUs and no writes unless set
        self.owners = owners
        self.use: dict[int, tuple[float, int] | None] = {}
        self.counters = {r: (50.0, 1 << 20) for r in range(N)}
        for h in self.seq:
            self._send(h, "hello", {"agent_version": "t", "interval": 1.0, "collectors": {},
                                    "nics": []})

    def _send(self, host: str, kind: str, body: dict[str, Any]) -> None:
        self.seq[host] += 1
        self.diag.observe(Frame(kind, host, "b00t", self.seq[host], 1.7e9 + self.t,
                                kinds.validate_body(kind, body)), self.t)

    @staticmethod
    def summary(r: int, started: int, completed: int, ops: int = 0,
                inflight_age: float | None = None) -> dict[str, Any]:
        return comm_summary(COMM, "j", N, GPUS, r, started, completed, ops, inflight_age)

    def healthy(self, seconds: int, ops: int = OPS) -> None:
        for _ in range(seconds):
            self.done += ops
            self.report({r: self.summary(r, self.done, self.done, ops) for r in range(N)})

    def report(self, summaries: dict[int, dict[str, Any] | None]) -> None:
        """One report per host (a rank mapped to None is not listed), then a tick."""
        for h in self.seq:
            comms = [s for r, s in sorted(summaries.items()) if s is not None and host_of(r) == h]
            body: dict[str, Any] = {"interval": 1.0, "health": {}, "nccl": {"comms": comms}}
            if self.owners:
                body["tcp_flows"] = {"flows": [], "omitted": 0, "tracked": 0, "map_full": 0,
                                     "drops": {}, "drops_delta": {}, "owners": [
                                         self._owner(r) for r in range(N) if host_of(r) == h]}
            self._send(h, "report", body)
        self.diag.tick(self.t)
        self.t += 1.0

    def _owner(self, r: int) -> dict[str, Any]:
        use = self.use.get(r, (1.2, 0))
        o: dict[str, Any] = {"pid": 1000 + r, "state": "S", "job": "j"}
        if use is not None:
            cpu, written = self.counters[r]
            self.counters[r] = cpu + use[0], written + use[1]
            o.update(cpu_s=self.counters[r][0], written=self.counters[r][1])
        return o

    def stall_event(self, r: int, waiting: list[tuple[int, str, str]], age: float,
                    seq: int | None = None) -> None:
        seq = self.done if seq is None else seq
        self._send(host_of(r), "event", {"type": "nccl_stall", "severity": "error", "attrs": {
            "comm": COMM, "rank": r, "nranks": N, "seq": seq, "func": "AllReduce",
            "age_s": age, "seq_completed": seq,
            "waiting": [{"peer": p, "channel": 0, "dir": d, "state": st, "idle_s": age}
                        for p, d, st in waiting]}})

    def hang(self, seconds: int, culprit: str, ahead: int | None = None,
             point_all: bool = False, repeat_once: int | None = None) -> None:
        """Every rank but CULPRIT enters ordinal `done` and waits there; the culprit: `idle`
        (stopped between collectives), `gone` (entered, then its summaries stopped), `frozen`
        (entered, the agent repeats its last summary), `exited` (its host reports without
        it), `kernel` (entered, stuck in a kernel; its plugin reports like everyone's).
        `ahead`: a rank that finished ordinal `done` and waits in the next one (downstream of
        a culprit stopped late in a pipelined ring). `point_all`: every waiting rank's stall
        message names the culprit (several rings through it). `repeat_once`: the agent
        repeats this rank's summary once (it missed a datagram) at age 7."""
        k = self.done
        last: dict[int, dict[str, Any] | None] = {}
        for age in range(1, seconds + 1):
            out: dict[int, dict[str, Any] | None] = {
                r: self.summary(r, k + 1, k, inflight_age=float(age)) for r in range(N)}
            if ahead is not None:
                out[ahead] = self.summary(ahead, k + 2, k + 1, ops=int(age == 1),
                                          inflight_age=float(age))
            if culprit == "idle":
                out[CULPRIT] = self.summary(CULPRIT, k, k)
            elif culprit in ("gone", "frozen", "exited") and age > 1:
                out[CULPRIT] = self.frozen.setdefault(CULPRIT, out[CULPRIT]) \
                    if culprit == "frozen" else None
            if repeat_once is not None and age == 7:
                out[repeat_once] = last[repeat_once]
            last = out
            self.report(out)
            if age == 5 and culprit != "none":  # the plugins' C4_STALL_MS: one per rank
                for r in range(N):
                    if out[r] is None or (culprit in ("idle", "frozen") and r == CULPRIT):
                        continue
                    waiting = [(CULPRIT, "recv", "RecvWait")] if point_all and r != CULPRIT \
                        else self.waiting(r, culprit)
                    self.stall_event(r, waiting, float(age), k + 1 if r == ahead else k)

    @staticmethod
    def waiting(r: int, culprit: str) -> list[tuple[int, str, str]]:
        """Proxy states of a ring stuck behind CULPRIT: data stops flowing out of it, so
        everyone downstream waits for data, its predecessor waits for credit, and the
        culprit itself (stuck in its kernel) waits on its own GPU."""
        nxt, prv = (r + 1) % N, (r - 1) % N
        if r == CULPRIT:
            return [(nxt, "send", "SendGPUWait"), (prv, "recv", "RecvGPUWait")]
        send = "SendPeerWait" if nxt == CULPRIT else "SendGPUWait"
        return [(nxt, "send", send), (prv, "recv", "RecvWait")]


def named(ring: PluginRing) -> dict[str, Any]:
    (inc,) = ring.diag.incidents()
    assert inc["class"] == "noncomm_hang", inc["summary"]
    assert inc["suspects"][0]["id"] == host_of(CULPRIT), inc
    assert inc["localised"] is not None
    return inc


@pytest.mark.parametrize("culprit", ["idle", "gone", "frozen", "exited", "kernel"])
def test_the_rank_that_stopped_is_named(culprit):
    ring = PluginRing(completed=0)
    ring.healthy(20)
    start = ring.t
    ring.hang(12, culprit)
    inc = named(ring)
    assert inc["localised"] - start <= 10.0
    assert inc["evidence"]["seq"] == ring.done  # the ordinal everyone else waits in
    assert CULPRIT in inc["evidence"]["culprit_ranks"]


def test_a_rank_that_finished_the_op_downstream_of_the_culprit_is_not_blamed():
    """The lab's syndrome (issue 13): the culprit stopped late inside ordinal k of a pipelined
    ring; its successor had everything it needed, finished k and waits in k + 1. The op the
    job waits in is k (the oldest incomplete one), not k + 1: the ranks still in k are not
    behind, and the culprit whose summaries stopped is named alone."""
    nxt = (CULPRIT + 1) % N
    for culprit in ("frozen", "gone"):
        ring = PluginRing(completed=0)
        ring.healthy(20)
        start = ring.t
        ring.hang(12, culprit, ahead=nxt)
        inc = named(ring)
        assert inc["localised"] - start <= 10.0
        assert inc["evidence"]["seq"] == ring.done
        assert inc["evidence"]["ahead_ranks"] == [nxt]
        assert inc["evidence"]["culprit_ranks"] == [CULPRIT]


def test_a_stopped_rank_is_named_from_the_stall_messages_before_the_threshold():
    """Issue 13 (the lab named a hang after 11-12 s against 10 s): at one collective a second
    the hang threshold is 10 s. A rank whose summaries froze (the agent repeats them, twice
    or more), named as the peer they wait on by the stall messages of ranks on other hosts,
    is the culprit at the plugin's stall threshold."""
    for culprit in ("frozen", "gone"):
        ring = PluginRing(completed=0)
        ring.healthy(20, ops=1)
        start = ring.t
        ring.hang(12, culprit, point_all=True)
        inc = named(ring)
        assert inc["localised"] - start <= 8.0 and inc["evidence"]["threshold_s"] == 10.0


def test_an_idle_rank_the_others_wait_on_waits_for_the_threshold():
    """An idle rank the stall messages point at is alive (its summaries move): a late rank or
    a checkpoint writer looks the same, so it is named at the threshold, not before."""
    ring = PluginRing(completed=0)
    ring.healthy(20, ops=1)
    start = ring.t
    ring.hang(14, "idle", point_all=True)
    inc = named(ring)
    assert inc["localised"] - start >= 10.0 and "early" not in inc["evidence"]


def test_one_repeated_summary_is_no_stopped_rank():
    """A busy agent misses a live rank's datagram and repeats its summary once: that rank
    did not stop (the culprit alone is named, one incident)."""
    ring = PluginRing(completed=0)
    ring.healthy(20)
    ring.hang(12, "idle", repeat_once=0)
    named(ring)


def test_the_culprit_coming_back_is_no_communication_hang():
    """SIGCONT: the stopped rank reports again, in the op; its peers' reports of that interval
    still say they wait, everyone inside. That is the hang clearing, not a second one."""
    ring = PluginRing(completed=0)
    ring.healthy(20)
    ring.hang(10, "gone", point_all=True)
    k = ring.done
    out = {r: ring.summary(r, k + 1, k, inflight_age=11.0) for r in range(N)}
    out[CULPRIT] = ring.summary(CULPRIT, k + 1, k, inflight_age=0.2)
    ring.report(out)
    ring.healthy(5)
    named(ring)


def test_first_collective_ordinal_zero():
    ring = PluginRing(completed=0)  # nothing completed: the hang is in ordinal 0
    ring.hang(12, "idle")
    inc = named(ring)
    assert inc["evidence"]["seq"] == 0


def test_just_started_communicator_shows_stalled_not_starting():
    ring = PluginRing(completed=0)
    ring.hang(8, "kernel")
    named(ring)
    (job,) = ring.diag.jobs()
    assert job["comms"][0]["state"] == "stalled"


def test_a_checkpoint_pause_between_collectives_is_no_hang():
    """Every rank idle, none in flight: a pause (checkpoint, evaluation), not a hang."""
    ring = PluginRing(completed=0)
    ring.healthy(20)
    for _ in range(30):
        ring.report({r: ring.summary(r, ring.done, ring.done) for r in range(N)})
    ring.healthy(5)
    assert ring.diag.incidents() == []


def test_what_a_job_taught_is_forgotten_an_hour_after_it_ended():
    """A 9 s checkpoint teaches job j a 13.5 s allowance. The job ends; back after more than
    hang.JOB_MEMORY_S, its idle rank is judged against the declared 10 s again (the learned
    pauses and writers of finished jobs must not pile up for ever)."""
    ring = PluginRing(completed=0, checkpoint_s=10.0)
    ring.healthy(20)
    ring.hang(9, "idle")
    ring.healthy(5)
    assert ring.diag.incidents() == []
    ring.t += 400.0  # the communicator expires
    ring.diag.tick(ring.t)
    ring.t += hang.JOB_MEMORY_S + 60.0
    ring.diag.tick(ring.t)
    ring.healthy(20)
    ring.hang(14, "idle")
    assert named(ring)["evidence"]["pause_allowance_s"] == 10.0


def test_ordinal_helpers():
    assert ordinals.oldest_incomplete(5, 5) is None and ordinals.oldest_incomplete(6, 5) == 5
    assert ordinals.behind(5, None, 5)  # idle after 5: has not entered ordinal 5
    assert not ordinals.behind(6, {"seq": 5, "func": "AllReduce"}, 5)
    assert ordinals.behind(5, {"seq": 5, "func": "Send"}, 5)  # a p2p op is not the collective
    assert not ordinals.behind(7, None, 5)


def test_a_hang_behind_a_dead_nic_joins_its_incident():
    """Before any stall message names a connection, the hang names nothing: the job's open
    NIC-down incident explains it (one incident per fault, not two)."""
    ring = PluginRing(completed=0)
    ring.healthy(10)
    ring._send("h2", "event", {"type": "nic_link", "severity": "error",
                               "attrs": {"pci": "0000:5e:00.0", "netdev": "eth0",
                                         "state": "down"}})
    ring.hang(8, "none")
    (inc,) = ring.diag.incidents()
    assert inc["class"] == "hw_nic_down" and "comm_hang" in inc["evidence"]["symptoms"]


# The culprit idle between collectives, what its process does meanwhile: (CPU s/s, bytes/s)
STILL = (0.01, 0)  # blocked (a deadlock, a stuck read): housekeeping threads only
WRITING = (0.4, 200 << 20)  # a checkpoint writer: serialises and writes
SPINNING = (1.0, 0)  # a hung busy loop, or a spin-wait in a CUDA sync


def idle_culprit(use: tuple[float, int] | None, seconds: int,
                 learned: bool = False) -> tuple[PluginRing, float]:
    """A ring with a 60 s checkpoint allowance whose CULPRIT stops calling collectives and
    does `use` (None: its agent cannot read its counters). `learned`: the job first recovered
    from two 20 s checkpoints written by the same rank (the allowance becomes 30 s)."""
    ring = PluginRing(completed=0, checkpoint_s=60.0, owners=True)
    ring.healthy(20)
    if learned:
        for _ in range(2):
            ring.use[CULPRIT] = WRITING
            ring.hang(20, "idle")
            ring.use.pop(CULPRIT)
            ring.healthy(10)
        assert ring.diag.incidents() == []
    ring.use[CULPRIT] = use
    start = ring.t
    ring.hang(seconds, "idle")
    return ring, start


@pytest.mark.parametrize("learned", [False, True])
def test_an_idle_rank_that_neither_runs_nor_writes_is_named_at_the_threshold(learned):
    """Issue 13: a rank alive but no longer calling collectives looked like a checkpoint
    writer and waited out the allowance (60 s, or 1.5x the checkpoints the job recovered
    from). Its process used no CPU and wrote nothing since its last collective: no writer;
    named at the normal threshold (10 collectives' worth, floor 10 s)."""
    ring, start = idle_culprit(STILL, 14, learned)
    inc = named(ring)
    assert inc["localised"] - start <= 12.0
    assert inc["evidence"]["still_ranks"] == [CULPRIT]
    assert "pause_allowance_s" not in inc["evidence"]


@pytest.mark.parametrize("use", [WRITING, SPINNING, None])
def test_a_writer_a_spinning_rank_or_unknown_counters_keep_the_allowance(use):
    """A rank that writes (a checkpoint), burns a CPU (a busy loop looks like serialising),
    or whose counters its agent cannot read (an older agent, no permission) is judged as
    before: quiet for the whole allowance, named after it."""
    ring, start = idle_culprit(use, 65)
    inc = named(ring)
    assert inc["localised"] - start >= 60.0
    assert inc["evidence"]["pause_allowance_s"] == 60.0 and "still_ranks" not in inc["evidence"]

"""Hangs: a collective in flight with no progress for longer than the job's own pace allows.

- Ranks that never entered the stalled op (seq behind) or stopped reporting are the culprits:
  non-communication hang, named by host (each host with culprits is its own finding). Ranks
  whose processes ended are named only once the rest of the job waits on past the time a
  restart takes to stop every host's processes (no verdict until then).
- When every rank entered, the connections still in network wait (SendWait, no bytes) are the
  stuck ones, and localise.py names their common NIC, link or path: communication hang.
Durations come from each host (inflight.progress_age_s) plus the time since that report
arrived on the aggregator's clock; no timestamps are compared across hosts."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Hashable

from c4.core import ordinals
from c4.core.topology import pair_hosts

from . import localise
from .config import DiagnosisConfig
from .findings import Finding, Suspect, describe
from .model import PAUSE_MARGIN, STOPPED, Comm, Model, Rank
from .slow import matrix, nic_path

STUCK_SHARE = 0.5  # a send connection that spent this share of the interval in SendWait
MAX_CULPRIT_HOSTS = 4  # beyond this, "everyone is behind someone": not localised
WRITER_PAUSES = 2  # recovered pauses, all by the same ranks, before others' are suspect
POINTING = ("RecvWait", "SendPeerWait")  # the waiter's peer holds it up
WAITING_ON_OTHERS = POINTING + ("SendWait",)  # a rank in these waits on a peer or the network
FROZEN_INTERVALS = 1.5  # a repeated in-flight summary listed this long after its last fresh one
EARLY_HOSTS = 2  # hosts whose stall messages point at a rank that stopped: named before the threshold
# An idle rank is still (no checkpoint writer) when, over at least STILL_SPAN of the stall, its
# process used under STILL_CPU of one CPU (a waiting process's housekeeping threads; a writer
# serialises, a spinning loop burns a whole one) and wrote under STILL_WRITTEN bytes (a log
# line; a checkpoint shard is megabytes)
STILL_CPU = 0.1
STILL_WRITTEN = 64 << 10
STILL_SPAN = 0.5
# What a job taught (its pauses' length, its checkpoint writers) outlives its last
# communicator this long on the aggregator's clock: a restart keeps it, a finished job's
# memory goes (the aggregator sees thousands of jobs over weeks).
JOB_MEMORY_S = 3600.0
# A job that restarts or ends stops its processes host by host, a second or so apart, and each
# host's report shows its own a report interval later: ranks whose processes ended are named
# (a crash, the others still waiting on them) only when the rest of the job has not followed
# them for this many of its report intervals after the first exit seen.
EXIT_INTERVALS = 3.0
ENDED = ("X", "Z")  # /proc state the agent reads for a process gone (or a zombie): it exited
SWEEP_S = 60.0  # how often jobs past their memory are looked for


class HangDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model) -> None:
        self.cfg = cfg
        self.model = model
        self.pause_s: dict[str, float] = {}  # job -> longest idle-rank pause it recovered from
        # job -> (ranks idle in the pauses it recovered from, how many, always the same)
        self.writers: dict[str, tuple[set[int], int, bool]] = {}
        self.pausing: dict[str, tuple[float, set[int]]] = {}  # comm -> pause going on, ranks
        self.named: dict[str, float] = {}  # comm -> last evaluation that named a culprit
        self.job_seen: dict[str, float] = {}  # job -> last evaluation of one of its comms
        self.exits: dict[str, float] = {}  # comm -> evaluation that first saw a rank's process end
        self.swept = 0.0

    def threshold(self, comm: Comm) -> float:
        return max(self.cfg.hang_floor_s, self.cfg.hang_op_factor * (comm.period or 0.0))

    def tick(self, comm: Comm, now: float) -> list[Finding]:
        self.job_seen[comm.job] = now
        found = self._tick(comm, now)
        if found and found[0].cls == "noncomm_hang":
            self.named[comm.comm] = now
        elif found and now - self.named.get(comm.comm, -1e18) <= \
                self.cfg.stale_intervals * comm.interval:
            # The culprit came back (SIGCONT): its peers' next reports show the op moving;
            # until they arrive they still say "stalled" with everyone inside, which is no
            # communication hang.
            return []
        return found

    def _tick(self, comm: Comm, now: float) -> list[Finding]:
        stale = self.cfg.stale_intervals * comm.interval
        # missing: a silent host, a process that ended, or one whose summaries stopped while
        # its host still reports (the agent repeats an in-flight summary whose ages no longer
        # move: SIGSTOP, a process stuck in the kernel with its plugin), twice in a row: a
        # busy agent misses one of a live process's datagrams now and then. Its last summary
        # is stale, so it does not say which op the job waits in.
        # A rank whose process its agent saw stopped (T, tcp_flows.owners) is missing too.
        # Ended: its process exited (its host reports without it, or its agent reads it gone
        # or a zombie); missing, but no verdict until the rest of the job had the time to exit
        # too (EXIT_INTERVALS): a restart is no hang. One whose summaries froze before its
        # agent dropped it stopped first (SIGSTOP, stuck with its plugin): judged as stopped.
        live: list[Rank] = []
        missing: list[Rank] = []
        stopped: list[Rank] = []
        ended: list[Rank] = []
        for r in comm.ranks.values():
            state = r.proc[0] if r.proc is not None and now - r.proc[1] <= stale else None
            if state in STOPPED:
                stopped.append(r)
            dropped = self.model.exited(r)  # its host reported without it
            frozen = r.inflight is not None and \
                r.listed - r.seen >= FROZEN_INTERVALS * comm.interval
            if state in ENDED or dropped and not frozen:
                ended.append(r)
            gone = dropped or frozen or state in ENDED or now - r.seen > stale
            (missing if gone or state in STOPPED else live).append(r)
        if not ended:
            self.exits.pop(comm.comm, None)
        elif now - self.exits.setdefault(comm.comm, now) < EXIT_INTERVALS * comm.interval:
            return []
        thr = self.threshold(comm)
        # the first collective: ranks start it as they finish loading
        first = max(thr, self.cfg.startup_grace_s)
        ages = {r.rank: _age(r, now) for r in live if r.inflight}
        stalled = [r for r in live if ages.get(r.rank, 0.0) >= (
            first if ordinals.position(r.seq_started, r.inflight)[0] == 0 else thr)]
        early: list[Rank] = []
        if not stalled:
            # Before the threshold, when the evidence already names the culprit: ranks whose
            # summaries stopped, pointed at by the stall messages (sent after the plugin's
            # stall threshold) of ranks on at least two other hosts. A late rank, a
            # checkpoint writer or a slow job shows no such thing: their summaries move.
            early, stalled = self._pointed_missing(comm, live, missing)
            if not early and stopped:
                # nothing legitimate stops a training process: named once a live rank has
                # waited an interval for it, not at the threshold
                stalled = [r for r in live if r.inflight and _age(r, now) >= comm.interval]
                early = stopped if stalled else []
            if not early:
                self._recovered(comm)
                return []
        # W: the oldest op a rank waits in without progress for an interval or more (c4/core/
        # ordinals.py: 0-based, unlike the counts seq_started / seq_completed), whether or not
        # it has waited past the threshold yet. Ops complete in stream order and no rank
        # completes a collective another never entered, so what holds the job is in W. Ranks
        # waiting in a later op are ahead, not behind: in a pipelined ring a rank downstream
        # of a rank stopped inside W can finish W (it needed nothing more through it) and wait
        # in W + 1, and cross the threshold first.
        waiting = stalled + [r for r in live if ages.get(r.rank, 0.0) >= comm.interval]
        wseq = min(ordinals.position(r.seq_started, r.inflight)[0] for r in waiting)
        # behind: stuck in an older op, or idle without having entered the stalled one
        behind = [r for r in live if ordinals.behind(r.seq_started, r.inflight, wseq)]
        stalled_s = max(ages[r.rank] for r in stalled)
        first = now - stalled_s
        ahead = [r.rank for r in stalled
                 if ordinals.position(r.seq_started, r.inflight)[0] > wseq]
        ev: dict[str, Any] = {"waiting_ranks": len(stalled), "live_ranks": len(live),
                              "stalled_s": round(stalled_s, 2), "threshold_s": round(thr, 2),
                              "seq": wseq, "func": stalled[0].inflight.get("func")}  # type: ignore[union-attr]
        if ahead:
            ev["ahead_ranks"] = sorted(ahead)[:32]
        if stopped:
            ev["stopped_ranks"] = sorted(r.rank for r in stopped)[:32]
        if early:  # named by the evidence, not the clock: only the ranks it points at
            ev["early"] = True
            return self._noncomm(comm, early, early, stalled, ev, first)
        culprits = behind + missing or self._blockers(comm, live)
        if behind and all(r.inflight is None and r.gpu_fault is None for r in behind):
            # alive and idle, not entering the op the others wait in: a checkpoint writer
            # looks exactly like this until it outlasts what the job's checkpoints take,
            # unless the job's checkpoints so far were written by other ranks, or every
            # idle rank neither runs nor writes (a rank whose GPU an Xid named is no
            # checkpoint writer either: it skips this allowance). Ranks missing meanwhile (a
            # crash during a checkpoint) are named without the writers inside it.
            idle = {r.rank for r in behind}
            writers, n, same = self.writers.get(comm.job, (set(), 0, True))
            if not missing:
                self.pausing[comm.comm] = (stalled_s, idle)
            if n >= WRITER_PAUSES and same and not idle <= writers:
                ev["checkpoint_writers"] = sorted(writers)[:16]
            elif all(_still(r, stalled_s) for r in behind):
                ev["still_ranks"] = sorted(idle)[:32]
            else:
                allowance = max(self.cfg.checkpoint_s, self.pause_s.get(comm.job, 0.0))
                if stalled_s >= allowance:
                    ev["pause_allowance_s"] = round(allowance, 1)
                elif missing:
                    culprits = missing
                else:
                    return []
        if culprits:
            return self._noncomm(comm, culprits, missing, stalled, ev, first)
        return [self._comm(comm, live, ev, first)]

    def _recovered(self, comm: Comm) -> None:
        """The op moves again: an idle-rank pause that ended by itself was legitimate (a
        checkpoint): the job's next ones may last as long. When the same ranks wrote every
        one of at least WRITER_PAUSES, another rank idle that way is no checkpoint."""
        pause = self.pausing.pop(comm.comm, None)
        if pause is not None:
            self.pause_s[comm.job] = max(self.pause_s.get(comm.job, 0.0), PAUSE_MARGIN * pause[0])
            writers, n, same = self.writers.get(comm.job, (set(), 0, True))
            self.writers[comm.job] = (writers | pause[1], n + 1,
                                      same and (n == 0 or pause[1] == writers))

    def forget(self, comm: Comm) -> None:
        self.pausing.pop(comm.comm, None)
        self.named.pop(comm.comm, None)
        self.exits.pop(comm.comm, None)

    def expire(self, now: float) -> None:
        """Forget what jobs without a communicator for JOB_MEMORY_S taught."""
        if now - self.swept < SWEEP_S:
            return
        self.swept = now
        for job in [j for j, t in self.job_seen.items() if now - t > JOB_MEMORY_S]:
            del self.job_seen[job]
            self.pause_s.pop(job, None)
            self.writers.pop(job, None)

    @staticmethod
    def _pointed_missing(comm: Comm, live: list[Rank],
                         missing: list[Rank]) -> tuple[list[Rank], list[Rank]]:
        """(missing ranks that stall messages of live ranks on at least EARLY_HOSTS other
        hosts point at, those live ranks). A stall message counts while its rank is still in
        the op it was sent for."""
        if not missing:
            return [], []
        ids = {r.rank: r for r in missing}
        hosts: dict[int, set[str]] = {}
        waiting: dict[int, Rank] = {}
        for r in live:
            st = r.stall or {}
            if r.inflight is None or st.get("seq") != r.inflight.get("seq"):
                continue
            for w in st.get("waiting", []):
                m = ids.get(w["peer"])
                if m is not None and w["state"] in WAITING_ON_OTHERS and m.host != r.host:
                    hosts.setdefault(m.rank, set()).add(r.host)
                    waiting[r.rank] = r
        early = [ids[p] for p, hs in hosts.items() if len(hs) >= EARLY_HOSTS]
        return early, list(waiting.values()) if early else []

    @staticmethod
    def _blockers(comm: Comm, live: list[Rank]) -> list[Rank]:
        """Every rank entered: the ones the others wait on that wait on nobody themselves.

        From the plugins' stall messages: a rank waiting for a peer's data (RecvWait) or
        buffer credit (SendPeerWait) points at that peer. A rank stuck in its kernel (GPU
        hung, process alive) is pointed at while its own connections wait only on its GPU;
        a rank behind a dead link waits on the network (SendWait) and is no blocker."""
        pointed: dict[int, set[str]] = {}
        for r in live:
            for w in (r.stall or {}).get("waiting", []):
                if w["state"] in POINTING and w["peer"] != r.rank:
                    pointed.setdefault(w["peer"], set()).add(w["state"])
        out = []
        for p, states in pointed.items():
            rk = comm.ranks.get(p)
            if rk is None or rk not in live:
                continue
            own = (rk.stall or {}).get("waiting")
            if own is None:  # no stall message of its own: both its sides must point at it
                if len(states) >= 2:
                    out.append(rk)
            elif not any(w["state"] in WAITING_ON_OTHERS for w in own):
                out.append(rk)
        return out

    def _noncomm(self, comm: Comm, culprits: list[Rank], missing: list[Rank],
                 stalled: list[Rank], ev: dict[str, Any], first: float) -> list[Finding]:
        by_host: dict[str, list[Rank]] = {}
        for r in culprits:
            by_host.setdefault(r.host, []).append(r)
        pointed: Counter[int] = Counter()  # stall events naming a culprit as the peer they wait on
        culprit_ranks = {r.rank for r in culprits}
        for r in stalled:
            for w in (r.stall or {}).get("waiting", []):
                if w["peer"] in culprit_ranks:
                    pointed[w["peer"]] += 1
        n_hosts = len(by_host)
        gone_ids = {r.rank for r in missing}
        out = []
        for host, ranks in sorted(by_host.items(), key=lambda kv: kv[0]):
            ranks.sort(key=lambda r: r.rank)
            gone = [r.rank for r in ranks if r.rank in gone_ids]
            conf = 0.9 if n_hosts <= 2 else 0.9 * 2 / n_hosts
            if n_hosts > MAX_CULPRIT_HOSTS:
                conf = min(conf, 0.5)
            if any(pointed[r.rank] for r in ranks):
                conf = min(0.99, conf + 0.05)
            r0 = ranks[0]
            seqs = [r.seq_completed for r in ranks if r.rank not in gone_ids]
            e = dict(ev, culprit_ranks=[r.rank for r in ranks][:32], missing_ranks=gone[:32],
                     suspect_seq_completed=min(seqs) if seqs else None,
                     stall_events_pointing=sum(pointed[r.rank] for r in ranks))
            stop = set(ev.get("stopped_ranks", ()))
            how = ("is stopped (T: a signal or a debugger)" if all(r.rank in stop for r in ranks)
                   else "stopped reporting" if len(gone) == len(ranks) else "never entered"
                   if any(ordinals.behind(r.seq_started, r.inflight, ev["seq"]) for r in ranks)
                   else "is stuck inside (its peers wait on it, it waits on its GPU)")
            summary = (f"rank {r0.rank} on {host} {how} {ev['func']} seq {ev['seq']}"
                       f"{f' (+{len(ranks) - 1} more ranks there)' if len(ranks) > 1 else ''}; "
                       f"{ev['waiting_ranks']} ranks wait on it for {ev['stalled_s']:.0f}s")
            out.append(Finding("noncomm_hang", comm.job, comm.comm,
                               [Suspect("host", host, host, r0.rank, conf)], summary, e, first))
        return out

    def _comm(self, comm: Comm, live: list[Rank], ev: dict[str, Any], first: float) -> Finding:
        stuck: set[tuple[int, int]] = set()
        share = STUCK_SHARE * comm.interval
        for r in live:
            for dst, (nbytes, net) in r.sends.items():
                if nbytes == 0 and net >= share:
                    stuck.add((r.rank, dst))
            for w in (r.stall or {}).get("waiting", []):
                if w["dir"] == "send" and w["state"] == "SendWait":
                    stuck.add((r.rank, w["peer"]))
        cells: dict[Hashable, list[localise.Component]] = {}
        for key, c in comm.cells.items():
            comps = self.model.components(comm, c)
            if comps is not None:
                cells[key] = comps
        stuck &= set(cells)
        ranked = localise.rank(stuck, cells) if stuck else []
        top = ranked[0] if ranked else None
        e = dict(ev, stuck_connections=sorted(f"{a}->{b}" for a, b in stuck)[:16])
        suspects: list[Suspect] = []
        aliases: tuple[str, ...] = ()
        # the stuck cells it explains: all are comm's (the filter types them as its keys)
        bad = [k for k in top.bad if k in comm.cells] if top is not None else []
        if top is not None:
            suspects, named, aliases = localise.name(top, nic_path(comm, bad))
            e.update(named, connections_through_suspect=top.n_all)
            cables = list(dict.fromkeys(lk for k in bad for lk in comm.cells[k].path or ())) \
                if pair_hosts(top.id) and "candidate_links" not in e else []
            if len(cables) >= 2:
                # One host pair's connections are stuck and the others, idle in the stall,
                # clear their cables in the vote: its cables are candidates the probes
                # measure (a lab run, 5 % loss both ways: the ring stalled, the loss finding
                # ended with the data, and the hang named the pair for 29 s while the legs
                # across the lossy link lost 27-40 of 400 a round).
                e["candidate_links"] = dict.fromkeys(cables, "both")
        where = describe(suspects[0], self.cfg.localise_confidence) if suspects else \
            "no single component (ambiguous)"
        summary = (f"all {ev['live_ranks']} ranks entered {ev['func']} seq {ev['seq']} and no "
                   f"data moved for {ev['stalled_s']:.0f}s; {len(stuck)} connection(s) stuck in "
                   f"network wait; suspect: {where}")
        return Finding("comm_hang", comm.job, comm.comm, suspects, summary, e, first,
                       matrix=matrix(comm, bad) if top else None, aliases=aliases)


def _still(r: Rank, stalled_s: float) -> bool:
    """Whether r's process neither ran nor wrote since its last completed collective, over
    at least STILL_SPAN of the stall (False when its agent does not report both counters)."""
    if r.usage is None:
        return False
    (t0, cpu0, w0, _), (t1, cpu1, w1) = r.usage
    span = t1 - t0
    return (span > 0 and span >= STILL_SPAN * stalled_s and cpu1 - cpu0 < STILL_CPU * span
            and w1 - w0 < STILL_WRITTEN)


def _age(r: Rank, now: float) -> float:
    inf = r.inflight or {}
    age = inf.get("progress_age_s")
    if age is None:
        age = inf.get("age_s", 0.0)
    return age + max(0.0, now - r.seen) if math.isfinite(age) else 0.0

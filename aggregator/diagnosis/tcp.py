"""Communication slow for jobs without the NCCL plugin (gloo, any TCP app): the same
per-connection matrix as slow.py, built from the agents' eBPF `tcp_flows` counters.

A cell is one host -> host direction of a job, measured by the sending host's sockets (the
bytes its peer acknowledged, its retransmits, its smoothed RTT), all sockets of the pair
together. Three metrics are judged against the job's baseline: seconds per GB acknowledged
(1 / goodput), retransmitted segments per MB and srtt; a cell is slow in an interval when any
is high. Persistence and localisation are slow.py's (localise.peel over hosts, NICs, learned
paths and the host pair), so the findings are ordinary `comm_slow` ones.

Agents list only flows that changed (every flow on a `refresh`): the state kept per flow
(key: host, saddr, sport, daddr, dport) is forgotten when the flow is reported `closed`, or
when a refresh with nothing omitted does not list it. An unlisted flow moved no data: its
cell has no sample that interval, neither slow nor healthy.

Hangs: a job whose flows on every host stopped moving (no host's report moved PROGRESS_BYTES)
for `hang_floor_s` while every host still reports them. The culprit is named from what a
hung process leaves: its state in the section's `owners` (`T`, stopped: named at the hang
floor; `D` in every report of the stall: named after the checkpoint allowance, since a
checkpoint writer throttled by its disk sleeps the same way), or its peers' flows to it
finding a zero receive window (it does not read; also named after the allowance: a
checkpoint writer does not read either). With no culprit the stall looks like a checkpoint,
evaluation or data loading (every process idle): an unlocalised `comm_hang` only after the
allowance (`checkpoint_s`, or 1.5x the longest idle stall the job recovered from) and, before
the job's pace is known, `startup_grace_s`.
"""
from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from . import localise
from .config import DiagnosisConfig
from .findings import Finding, Suspect, describe
from .model import (PACE_REPORTS, PAUSE_MARGIN, STOPPED, Model, SlowWindow, Sock, ballot,
                    bare_addr)
from .slow import FRESH_INTERVALS
from .stats import lower_baseline, median

PROGRESS_BYTES = 4096  # a host's report that moved less on a job's flows: no progress there
MAX_CULPRIT_HOSTS = 4  # beyond this, "everyone is behind someone": not localised

# metric -> (floor before the log: values below it are "none", unit in summaries)
METRICS: dict[str, tuple[float, str]] = {
    "s_per_gb": (1e-6, "s/GB"),
    "retrans_per_mb": (1e-2, "retransmits/MB"),
    "srtt_us": (1.0, "us srtt"),
}


FlowKey = tuple[str, int, str, int]  # a flow as its host lists it: saddr, sport, daddr, dport


@dataclass(slots=True)
class Flow:
    """One socket as last listed by its host."""

    job: str
    daddr: str
    bytes_acked: int
    retrans_segs: int
    srtt_us: int
    seen: float


@dataclass
class TcpCell(SlowWindow):
    src: str
    dst: str
    values: dict[str, float] = field(default_factory=dict)  # last interval with data
    slow_values: dict[str, float] = field(default_factory=dict)  # last slow interval
    bad: tuple[str, ...] = ()  # metrics high in the last slow interval
    seen: float = -1e18
    nics: tuple[str | None, str | None] = (None, None)
    socks: tuple[Sock, ...] = ()  # its bulk sockets in the last interval with data
    path: list[str] | None = None
    comps: list[localise.Component] = field(default_factory=list)
    tag: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        SlowWindow.__init__(self)


@dataclass
class Owner:
    """A process owning some of a job's flows on a host, as the host's latest report saw it."""

    state: str
    since: float  # arrival of the first report of the current run of this state


@dataclass
class TcpJob:
    job: str
    interval: float = 1.0
    cells: dict[tuple[str, str], TcpCell] = field(default_factory=dict)
    baseline: dict[str, tuple[float, float]] | None = None  # metric -> (log center, sigma)
    # hang state, per host with tracked flows of the job: arrival of its latest report, of
    # its latest report that moved data, the gaps between those (pace), its owners
    first: float = 0.0
    reported: dict[str, float] = field(default_factory=dict)
    progress: dict[str, float] = field(default_factory=dict)
    gaps: dict[str, deque[float]] = field(default_factory=dict)
    owners: dict[str, dict[int, Owner]] = field(default_factory=dict)
    zero: dict[str, dict[str, float]] = field(default_factory=dict)  # dst -> src -> arrival
    pause_s: float = 0.0  # 1.5x the longest culprit-free stall it recovered from (learned)
    # (start, whether its length teaches the job's pauses) of the stall going on: not when a
    # process was stopped in it, nor before the job's pace was known (start-up)
    stall: tuple[float, bool] | None = None


class TcpDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model) -> None:
        self.cfg = cfg
        self.model = model
        self.mask = (1 << cfg.slow_window) - 1
        self.flows: dict[str, dict[FlowKey, Flow]] = {}  # host -> flow key -> state
        self.jobs: dict[str, TcpJob] = {}
        self.skipped: Counter[str] = Counter()  # flows not diagnosed, by reason
        self.host_jobs: dict[str, Counter[str]] = {}  # host -> job -> its tracked flows

    # -- input ----------------------------------------------------------------------------
    def on_report(self, host: str, section: dict[str, Any], interval: float,
                  now: float) -> None:
        table = self.flows.setdefault(host, {})
        counts = self.host_jobs.setdefault(host, Counter())
        before = set(counts)
        listed: set[FlowKey] = set()
        # (job, daddr) -> [acked, retrans, rtt*bytes, saddr, its bulk sockets]
        acc: dict[tuple[str, str], list[Any]] = {}
        moved: Counter[str] = Counter()  # job -> bytes its flows here moved this interval
        zero: list[tuple[str, str]] = []  # (job, daddr) whose window was 0 this interval
        # A report's flows share a few owners and source addresses: each is resolved once
        # here (the model does not change while one report is read).
        jobs: dict[tuple[Any, Any], str | None] = {}  # (pid, agent's job) -> job
        srcs: set[str] = set()
        addrs, min_bytes = self.model.addrs, self.cfg.tcp_min_bytes
        no_job = 0
        for f in section.get("flows") or ():
            saddr, daddr = f["saddr"], f["daddr"]
            key = (saddr, f["sport"], daddr, f["dport"])
            listed.add(key)
            owner = (f.get("pid"), f.get("job"))
            job = jobs[owner] if owner in jobs else self._job_of(host, f, jobs)
            if not job:
                no_job += 1
                if key in table:
                    self._drop(table, counts, key)
                continue
            if saddr not in srcs:
                srcs.add(saddr)
                addrs.setdefault(bare_addr(saddr), (host, None))
            if f["closed"]:
                self._drop(table, counts, key)
            else:
                old = table.get(key)
                if old is not None and old.job == job:
                    old.bytes_acked, old.retrans_segs = f["bytes_acked"], f["retrans_segs"]
                    old.srtt_us, old.seen = f["srtt_us"], now
                else:
                    self._drop(table, counts, key)
                    counts[job] += 1
                    table[key] = Flow(job, daddr, f["bytes_acked"], f["retrans_segs"],
                                      f["srtt_us"], now)
            acked = f["bytes_acked_delta"]
            a = acc.get((job, daddr))
            if a is None:
                a = acc[(job, daddr)] = [0, 0, 0.0, saddr, []]
            a[0] += acked
            if acked >= min_bytes:
                a[4].append((bare_addr(saddr), f["sport"], bare_addr(daddr), f["dport"]))
            a[1] += f["retrans_segs_delta"]
            a[2] += f["srtt_us"] * acked
            moved[job] += acked + f["bytes_received_delta"]
            if f.get("zero_window_delta"):
                zero.append((job, daddr))
        if no_job:
            self.skipped["no_job"] += no_job
        if section.get("refresh") and not section.get("omitted"):
            for key in [k for k in table if k not in listed]:
                self._drop(table, counts, key)  # the host no longer has it (a missed close)
        for (job, daddr), (acked, retrans, rtt_b, saddr, socks) in acc.items():
            self._sample(host, job, saddr, daddr, acked, retrans, rtt_b, interval, now,
                         tuple(sorted(socks)))
        self._progress(host, section, counts, moved, zero, jobs, interval, now)
        for job in before - set(counts):  # none of its flows left here
            self.model.set_flows(job, host, 0)
            if job in self.jobs:
                self._forget_host(self.jobs[job], host)
        for job, n in counts.items():
            self.model.set_flows(job, host, n)

    def _job_of(self, host: str, f: dict[str, Any],
                jobs: dict[tuple[Any, Any], str | None]) -> str | None:
        """model.job_of_flow, once per owner (pid, the agent's job) of one report: `jobs`
        lives as long as the report (the next one may find the pid another process's)."""
        owner = (f.get("pid"), f.get("job"))
        if owner in jobs:
            return jobs[owner]
        job = jobs[owner] = self.model.job_of_flow(host, f)
        return job

    @staticmethod
    def _drop(table: dict[FlowKey, Flow], counts: Counter[str], key: FlowKey) -> None:
        old = table.pop(key, None)
        if old is not None:
            counts[old.job] -= 1
            if counts[old.job] <= 0:
                del counts[old.job]

    def _job(self, job: str, now: float) -> TcpJob:
        tj = self.jobs.get(job)
        if tj is None:
            tj = self.jobs[job] = TcpJob(job, first=now)
        return tj

    def _progress(self, host: str, section: dict[str, Any], counts: Counter[str],
                  moved: Counter[str], zero: list[tuple[str, str]],
                  jobs: dict[tuple[Any, Any], str | None], interval: float, now: float) -> None:
        """Hang state: which jobs' flows this host holds, whether they moved, the state of
        their processes, and the peers whose receive window was closed to them. `jobs`: the
        report's owners already resolved, (pid, agent's job) -> job."""
        owners: dict[str, dict[int, str]] = {}
        for o in (section.get("owners") or ()) if counts else ():  # kept per tracked job
            job = self._job_of(host, o, jobs)  # mostly the flows' owners: resolved
            if job:
                owners.setdefault(job, {})[o["pid"]] = o["state"]
        for job in counts:
            tj = self._job(job, now)
            tj.interval = interval or tj.interval
            tj.reported[host] = now
            if moved[job] >= PROGRESS_BYTES:
                last = tj.progress.get(host)
                if last is not None:
                    tj.gaps.setdefault(host, deque(maxlen=PACE_REPORTS)).append(now - last)
                tj.progress[host] = now
            before = tj.owners.get(host, {})
            tj.owners[host] = {
                pid: before[pid] if pid in before and before[pid].state == st else Owner(st, now)
                for pid, st in owners.get(job, {}).items()}
        for job, daddr in zero:
            peer = self.model.addrs.get(bare_addr(daddr))
            if peer is not None and peer[0] != host and job in self.jobs:
                self.jobs[job].zero.setdefault(peer[0], {})[host] = now

    def forget_hosts(self, hosts: set[str]) -> None:
        """Hosts silent past `host_expire_s` (Diagnosis): their flow tables, their place
        in each job (as a sender, and as the peer whose window was closed)."""
        for h in hosts:
            self.flows.pop(h, None)
            for job in self.host_jobs.pop(h, {}):
                self.model.set_flows(job, h, 0)
        for tj in self.jobs.values():
            for h in hosts:
                self._forget_host(tj, h)
            for key in [k for k in tj.cells if k[0] in hosts or k[1] in hosts]:
                del tj.cells[key]
            for senders in tj.zero.values():
                for h in hosts & senders.keys():
                    del senders[h]

    @staticmethod
    def _forget_host(tj: TcpJob, host: str) -> None:
        for d in (tj.reported, tj.progress, tj.gaps, tj.owners, tj.zero):
            d.pop(host, None)

    def _sample(self, host: str, job: str, saddr: str, daddr: str, acked: int, retrans: int,
                rtt_b: float, interval: float, now: float, socks: tuple[Sock, ...]) -> None:
        peer = self.model.addrs.get(bare_addr(daddr))
        if peer is None or peer[0] == host:
            self.skipped["peer_unknown" if peer is None else "local"] += 1
            return
        tj = self._job(job, now)
        tj.interval = interval or tj.interval
        cell = tj.cells.get((host, peer[0]))
        if cell is None:
            cell = tj.cells[(host, peer[0])] = TcpCell(host, peer[0])
        own = self.model.addrs.get(bare_addr(saddr), (host, None))
        cell.nics = (self.model.nic_of_netdev(host, own[1]),
                     self.model.nic_of_netdev(peer[0], peer[1]))
        if acked < self.cfg.tcp_min_bytes or interval <= 0:
            return  # idle this interval: neither slow nor healthy
        cell.socks = socks
        cell.values = {"s_per_gb": interval / acked * 1e9,
                       "retrans_per_mb": retrans / (acked / 1e6),
                       "srtt_us": rtt_b / acked}
        cell.seen = now
        if tj.baseline is None:
            return
        bad = tuple(m for m in METRICS if self._high(tj.baseline, m, cell.values[m]))
        if bad:
            cell.slow_values, cell.bad = dict(cell.values), bad
        cell.push(bool(bad), now, self.mask)

    def _high(self, base: dict[str, tuple[float, float]], metric: str, v: float,
              ratio: float | None = None) -> bool:
        center, sigma = base[metric]
        ratio = ratio or self.cfg.slow_ratio
        if _log(metric, v) < center + max(math.log(ratio), self.cfg.slow_z * sigma):
            return False
        return metric != "retrans_per_mb" or v >= self.cfg.tcp_retrans_per_mb

    # -- evaluation -----------------------------------------------------------------------
    def tick(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for tj in list(self.jobs.values()):
            expire = self.cfg.comm_expire_intervals * tj.interval
            for key in [k for k, c in tj.cells.items() if now - c.seen > expire]:
                del tj.cells[key]
            for host in [h for h, t in tj.reported.items() if now - t > expire]:
                self._forget_host(tj, host)  # its agent went away (the silent-host detector's)
            if not tj.cells and not tj.reported:
                del self.jobs[tj.job]
                continue
            if tj.job not in self.model.comm_jobs:
                # a job the plugin reports is judged by its collectives (slow.py, hang.py):
                # a second matrix over its sockets blamed a host beside the real culprit (a
                # straggler's ring in the lab); its bootstrap and store sockets are idle by
                # design, its data may use RDMA. Its flows still feed loss and outage votes.
                if tj.cells:
                    out += self._judge(tj, now)
                out += self._hang(tj, now)
        return out

    # -- hangs ----------------------------------------------------------------------------
    def _hang(self, tj: TcpJob, now: float) -> list[Finding]:
        cfg = self.cfg
        hosts = sorted(tj.reported)
        if len(hosts) < 2:
            return []
        start = max(tj.progress.get(h, tj.first) for h in hosts)
        stalled = now - start
        stale = cfg.stale_intervals * tj.interval
        if stalled < cfg.hang_floor_s or any(now - tj.reported[h] > stale for h in hosts):
            if tj.stall is not None and stalled < cfg.hang_floor_s:  # it moves again
                if tj.stall[1]:  # recovered by itself: the job's pauses last this long
                    tj.pause_s = max(tj.pause_s, PAUSE_MARGIN * (start - tj.stall[0]))
                tj.stall = None
            return []
        stopped = {h: sorted(p for p, o in tj.owners.get(h, {}).items() if o.state in STOPPED)
                   for h in hosts}
        stopped = {h: p for h, p in stopped.items() if p}
        gaps = [median(g) for h in hosts if len(g := tj.gaps.get(h, ())) >= 3]
        started = len(gaps) * 2 > len(hosts)
        pace = median(gaps) if started else 0.0
        tj.stall = (start, started and not stopped and (tj.stall is None or tj.stall[1]))
        allowance = max(cfg.checkpoint_s, tj.pause_s)
        ev: dict[str, Any] = {
            "transport": "tcp", "stalled_s": round(stalled, 2), "hosts": len(hosts),
            "idle_flows": sum(self.host_jobs[h][tj.job] for h in hosts if h in self.host_jobs)}
        if stopped:
            thr = cfg.hang_floor_s
            culprits = {h: ("stopped", p) for h, p in stopped.items()}
        else:
            thr = max(cfg.hang_floor_s, cfg.hang_op_factor * pace, allowance,
                      0.0 if started else cfg.startup_grace_s)
            if stalled < thr:
                return []
            ev["pause_allowance_s"] = round(allowance, 1)
            culprits = self._sleepers(tj, hosts, start)
        ev["threshold_s"] = round(thr, 2)
        if not culprits:
            summary = (f"every TCP connection of job {tj.job} on its {len(hosts)} hosts "
                       f"idle for {stalled:.0f}s while its processes run; no process stopped "
                       f"and no receive window closed: no single component (ambiguous)")
            return [Finding("comm_hang", tj.job, None, [], summary, ev, start)]
        return self._noncomm(tj, culprits, ev, start, now)

    def _sleepers(self, tj: TcpJob, hosts: list[str],
                  start: float) -> dict[str, tuple[str, list[int]]]:
        """Hosts whose process slept in D through the whole stall, or to which peers found
        the receive window closed during it (it does not read)."""
        out: dict[str, tuple[str, list[int]]] = {}
        for h in hosts:
            d = sorted(p for p, o in tj.owners.get(h, {}).items()
                       if o.state == "D" and o.since <= start + tj.interval)
            if d:
                out[h] = ("uninterruptible", d)
            elif any(t >= start for t in tj.zero.get(h, {}).values()):
                out[h] = ("not reading", sorted(tj.owners.get(h, {})))
        return out

    def _noncomm(self, tj: TcpJob, culprits: dict[str, tuple[str, list[int]]],
                 ev: dict[str, Any], start: float, now: float) -> list[Finding]:
        n = len(culprits)
        out = []
        for host, (how, pids) in sorted(culprits.items()):
            closed = sorted(src for src, t in tj.zero.get(host, {}).items() if t >= start)
            conf = 0.9 if n <= 2 else 0.9 * 2 / n
            if n > MAX_CULPRIT_HOSTS:
                conf = min(conf, 0.5)
            if closed and how != "not reading":
                conf = min(0.99, conf + 0.05)  # its peers' windows say the same
            states = {str(p): o.state for p, o in tj.owners.get(host, {}).items()}
            e = dict(ev, culprit_pids=pids[:16], process_states=dict(list(states.items())[:16]),
                     zero_window_from=closed[:16], culprit=how)
            what = {"stopped": "is stopped (T)", "uninterruptible":
                    "sleeps uninterruptibly (D)", "not reading":
                    "does not read (its peers see a zero receive window)"}[how]
            pid = f"process {pids[0]}" if pids else "the job's process"
            summary = (f"{pid} of job {tj.job} on {host} {what}; every TCP connection of the "
                       f"job on its {ev['hosts']} hosts idle for {ev['stalled_s']:.0f}s")
            out.append(Finding("noncomm_hang", tj.job, None,
                               [Suspect("host", host, host, None, conf)], summary, e, start))
        return out

    def _judge(self, tj: TcpJob, now: float) -> list[Finding]:
        window = FRESH_INTERVALS * tj.interval
        fresh = [c for c in tj.cells.values() if now - c.seen <= window]
        hosts = {h for c in fresh for h in (c.src, c.dst)}
        if len(hosts) < self.cfg.tcp_min_hosts or len(fresh) < self.cfg.min_cells:
            tj.baseline = None
            return []
        tj.baseline = {m: lower_baseline([_log(m, c.values[m]) for c in fresh])
                       for m in METRICS}
        doubt = math.sqrt(self.cfg.slow_ratio)
        base = tj.baseline
        bad, cells = ballot({(c.src, c.dst): c for c in fresh}, self.cfg.slow_persist,
                            self.cfg.slow_hold_s,
                            lambda k: any(self._high(base, m, tj.cells[k].values[m], doubt)
                                          for m in METRICS),
                            lambda k: self._components(tj.cells[k]))
        if not bad:
            return []
        values = {k: max(tj.cells[k].slow_values[m] / math.exp(tj.baseline[m][0])  # type: ignore[index]
                         for m in tj.cells[k].bad) for k in bad}  # type: ignore[index]
        found, rest = localise.peel(bad, cells, self.cfg.localise_confidence, values,
                                    self.cfg.slow_ratio)
        out = [self._finding(tj, ranked) for ranked in found]
        if rest:
            out.append(self._finding(tj, rest))
        return out

    def _components(self, c: TcpCell) -> list[localise.Component]:
        return self.model.place(c, c.src, c.nics[0], c.dst, c.nics[1], c.socks)

    def _finding(self, tj: TcpJob, ranked: list[localise.Hypothesis]) -> Finding:
        top = ranked[0]
        cells = [tj.cells[k] for k in top.bad]  # type: ignore[index]
        base = tj.baseline or {}
        metrics: dict[str, dict[str, float]] = {}
        for m in METRICS:
            hit = [c.slow_values[m] for c in cells if m in c.bad]
            if hit:
                metrics[m] = {"baseline": round(math.exp(base[m][0]), 4),
                              "slow": round(median(hit), 4), "connections": len(hit)}
        evidence: dict[str, Any] = {
            "transport": "tcp",
            "slow_connections": top.n_bad,
            "connections_through_suspect": top.n_all,
            "metrics": metrics,
            "connections": [f"{c.src}->{c.dst}" for c in cells[:8]],
            "paths_voting": localise.votes(top.bad, {k: tj.cells[k].path  # type: ignore[index]
                                                     for k in top.bad}),
        }
        ends = {f"{c.nics[0] or c.src}->{c.nics[1] or c.dst}" for c in cells}
        suspects, named, aliases = localise.name(top, ends.pop() if len(ends) == 1 else None)
        evidence.update(named)
        what = describe(suspects[0], self.cfg.localise_confidence)
        shown = "; ".join(f"{METRICS[m][1]} {v['slow']:.3g} vs {v['baseline']:.3g}"
                          for m, v in metrics.items())
        summary = (f"{top.n_bad} TCP connection(s) of job {tj.job} stand out ({shown}); "
                   f"suspect: {what}")
        return Finding("comm_slow", tj.job, None, suspects, summary, evidence,
                       min(c.since for c in cells), aliases=aliases)


def _log(metric: str, v: float) -> float:
    return math.log(max(v, METRICS[metric][0]))

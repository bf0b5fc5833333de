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
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Hashable

from . import localise
from .config import DiagnosisConfig
from .findings import Finding
from .model import Model, bare_addr
from .slow import FRESH_INTERVALS, describe
from .stats import lower_baseline, median

# metric -> (floor before the log: values below it are "none", unit in summaries)
METRICS: dict[str, tuple[float, str]] = {
    "s_per_gb": (1e-6, "s/GB"),
    "retrans_per_mb": (1e-2, "retransmits/MB"),
    "srtt_us": (1.0, "us srtt"),
}


@dataclass
class Flow:
    """One socket as last listed by its host."""

    job: str
    daddr: str
    bytes_acked: int
    retrans_segs: int
    srtt_us: int
    seen: float


@dataclass
class TcpCell:
    src: str
    dst: str
    values: dict[str, float] = field(default_factory=dict)  # last interval with data
    slow_values: dict[str, float] = field(default_factory=dict)  # last slow interval
    bad: tuple[str, ...] = ()  # metrics high in the last slow interval
    seen: float = -1e18
    hist: int = 0  # bit i: the sample i samples ago was slow
    streak: int = 0
    since: float = 0.0
    last_slow: float = 0.0
    nics: tuple[str | None, str | None] = (None, None)
    path: list[str] | None = None
    comps: list[localise.Component] = field(default_factory=list)
    tag: tuple | None = None


@dataclass
class TcpJob:
    job: str
    interval: float = 1.0
    cells: dict[tuple[str, str], TcpCell] = field(default_factory=dict)
    baseline: dict[str, tuple[float, float]] | None = None  # metric -> (log center, sigma)


class TcpDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model) -> None:
        self.cfg = cfg
        self.model = model
        self.mask = (1 << cfg.slow_window) - 1
        self.flows: dict[str, dict[tuple, Flow]] = {}  # host -> flow key -> state
        self.jobs: dict[str, TcpJob] = {}
        self.skipped: Counter[str] = Counter()  # flows not diagnosed, by reason

    # -- input ----------------------------------------------------------------------------
    def on_report(self, host: str, section: dict[str, Any], interval: float,
                  now: float) -> None:
        table = self.flows.setdefault(host, {})
        listed: set[tuple] = set()
        acc: dict[tuple[str, str], list] = {}  # (job, daddr) -> [acked, retrans, rtt*bytes]
        for f in section.get("flows") or ():
            key = (f["saddr"], f["sport"], f["daddr"], f["dport"])
            listed.add(key)
            job = self.model.job_of_flow(host, f)
            if not job:
                self.skipped["no_job"] += 1
                table.pop(key, None)
                continue
            self.model.addrs.setdefault(bare_addr(f["saddr"]), (host, None))
            if f["closed"]:
                table.pop(key, None)
            else:
                table[key] = Flow(job, f["daddr"], f["bytes_acked"], f["retrans_segs"],
                                  f["srtt_us"], now)
            a = acc.setdefault((job, f["daddr"]), [0, 0, 0.0, f["saddr"]])
            a[0] += f["bytes_acked_delta"]
            a[1] += f["retrans_segs_delta"]
            a[2] += f["srtt_us"] * f["bytes_acked_delta"]
        if section.get("refresh") and not section.get("omitted"):
            for key in [k for k in table if k not in listed]:
                del table[key]  # the host no longer has it (a close we did not hear of)
        for (job, daddr), (acked, retrans, rtt_b, saddr) in acc.items():
            self._sample(host, job, saddr, daddr, acked, retrans, rtt_b, interval, now)

    def _sample(self, host: str, job: str, saddr: str, daddr: str, acked: int, retrans: int,
                rtt_b: float, interval: float, now: float) -> None:
        peer = self.model.addrs.get(bare_addr(daddr))
        if peer is None or peer[0] == host:
            self.skipped["peer_unknown" if peer is None else "local"] += 1
            return
        tj = self.jobs.get(job)
        if tj is None:
            tj = self.jobs[job] = TcpJob(job)
        tj.interval = interval or tj.interval
        cell = tj.cells.get((host, peer[0]))
        if cell is None:
            cell = tj.cells[(host, peer[0])] = TcpCell(host, peer[0])
        own = self.model.addrs.get(bare_addr(saddr), (host, None))
        cell.nics = (self.model.nic_of_netdev(host, own[1]),
                     self.model.nic_of_netdev(peer[0], peer[1]))
        if acked < self.cfg.tcp_min_bytes or interval <= 0:
            return  # idle this interval: neither slow nor healthy
        cell.values = {"s_per_gb": interval / acked * 1e9,
                       "retrans_per_mb": retrans / (acked / 1e6),
                       "srtt_us": rtt_b / acked}
        cell.seen = now
        if tj.baseline is None:
            return
        bad = tuple(m for m in METRICS if self._high(tj.baseline, m, cell.values[m]))
        if bad:
            cell.slow_values, cell.bad = dict(cell.values), bad
            if not cell.hist:
                cell.since = now
            cell.last_slow = now
        cell.hist = ((cell.hist << 1) | bool(bad)) & self.mask
        cell.streak = bin(cell.hist).count("1")

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
            if not tj.cells:
                del self.jobs[tj.job]
                continue
            out += self._judge(tj, now)
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
        bad = {(c.src, c.dst) for c in fresh if c.streak >= self.cfg.slow_persist
               and c.last_slow - c.since >= self.cfg.slow_hold_s}
        if not bad:
            return []
        # as in slow.py: cells slow now but not persistently, or elevated below the
        # threshold, are evidence of neither health nor fault
        doubt = math.sqrt(self.cfg.slow_ratio)
        cells: dict[Hashable, list[localise.Component]] = {}
        for c in fresh:
            key = (c.src, c.dst)
            if key not in bad and (c.streak or any(
                    self._high(tj.baseline, m, c.values[m], doubt) for m in METRICS)):
                continue
            cells[key] = self._components(c)
        values = {k: max(tj.cells[k].slow_values[m] / math.exp(tj.baseline[m][0])
                         for m in tj.cells[k].bad) for k in bad}  # type: ignore[index]
        found, rest = localise.peel(bad, cells, self.cfg.localise_confidence, values,
                                    self.cfg.slow_ratio)
        out = [self._finding(tj, ranked) for ranked in found]
        if rest:
            out.append(self._finding(tj, rest))
        return out

    def _components(self, c: TcpCell) -> list[localise.Component]:
        tag = (c.src, c.dst) + c.nics
        if c.tag != tag:
            c.path, c.comps = self.model.path_components(c.src, c.nics[0], c.dst, c.nics[1])
            c.tag = tag
        return c.comps

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

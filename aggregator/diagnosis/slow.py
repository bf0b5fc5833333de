"""Communication slow: the per-connection latency matrix (network wait per byte of each
rank -> peer send connection), robust outliers, and localisation of the persistent ones.

Only the slow hop spends long in SendWait per byte; its victims wait for credit or for the
GPU (peer_wait_s / gpu_wait_s), which this matrix ignores. Cells are judged on arrival
against the baseline of the communicator computed at the previous tick (incremental: no
batch pass over history).

A healthy link shared by more of the job's connections gives each a smaller share of it (C4P
moved them there). Where the job's connections move data at their load share (the most of
its connections per Gbit/s on a link of their path: their time per byte divided by it spreads
less than the time per byte itself), each is judged against its share, not the job's
baseline."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Hashable, Sequence

from . import localise
from .config import DiagnosisConfig
from .counters import Counters
from .findings import Finding, describe
from .model import MARGINAL_REPORTS, Cell, Comm, Model, Rank, ballot
from .probes import Prober
from .stats import lower_baseline, median, quantile

FRESH_INTERVALS = 2.5  # a cell's sample counts in the baseline for this many intervals
# marginal slowness: judged over a cell's last MARGINAL_REPORTS (model.py), from this many on
MARGINAL_MIN_REPORTS = 10
MARGINAL_Z = 4.0  # standard errors of the median above the baseline
MARGINAL_MIN_RATIO = 1.05  # and at least this slow: path-length differences are not faults
MARGINAL_ABOVE = 0.8  # share of its reports above the job's median cell
# a component is named once the test has found it over this many reporting intervals (a gap
# of up to 2 continues a run): the verdict must survive new reports. The 20-report medians
# of two connections cross the test now and then by chance for one report (2 localised in 20
# clean hours, each found in 2 evaluations of one report); a slow NIC's stay across (one at
# 67 % flickered out after 3 evaluations while a connection was slow per report: 3 was too
# many)
MARGINAL_HOLD = 2
MATRIX_LABELS = 16


class SlowDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model, counters: Counters,
                 prober: Prober | None = None) -> None:
        self.cfg = cfg
        self.model = model
        self.counters = counters
        self.prober = prober
        self.mask = (1 << cfg.slow_window) - 1
        self.gbps: dict[str, float] = {}  # a load unit's capacity, 0 unknown (the topology's)

    def on_report(self, comm: Comm, rk: Rank, now: float) -> None:
        for dst, (nbytes, net) in rk.sends.items():
            key = (rk.rank, dst)
            cell = comm.cells.get(key)
            if cell is None:
                cell = comm.cells[key] = Cell(rk.rank, dst)
            if nbytes < self.cfg.min_cell_bytes:
                continue  # no data this interval: neither slow nor healthy
            cell.value = max(net, 1e-12) / nbytes
            cell.seen = now
            if comm.baseline is None:
                continue
            center, sigma = expected(comm, cell)
            dev = math.log(cell.value) - center
            cell.devs.append(dev)
            slow = dev >= max(math.log(self.cfg.slow_ratio), self.cfg.slow_z * sigma)
            if slow:
                cell.slow_value = cell.value
            cell.push(slow, now, self.mask)
            if cell.persistent(self.cfg.slow_persist, self.cfg.slow_hold_s):
                cell.hot = True
            elif cell.hot and not cell.streak:
                # persistently slow per report, now healed: those reports were the per-report
                # test's evidence; kept, their medians named its host after a heal (c4 sim)
                cell.hot = False
                cell.devs.clear()

    def tick(self, comm: Comm, now: float) -> list[Finding]:
        window = FRESH_INTERVALS * comm.interval
        fresh = [c for c in comm.cells.values() if now - c.seen <= window]
        if len(fresh) < self.cfg.min_cells:
            comm.baseline = None
            return []
        comm.baseline = lower_baseline([math.log(c.value) for c in fresh])
        self._shares(comm, fresh)
        if self.prober is not None:  # slow now, path unknown: traced before it is judged
            self.prober.trace(comm, (c for c in fresh if c.streak), now)
        out = self._marginal(comm, fresh, now)
        # slow in most recent reports, and over a span of slow_hold_s (a burst is shorter)
        doubt = 0.5 * math.log(self.cfg.slow_ratio)
        bad, cells = ballot({(c.src, c.dst): c for c in fresh}, self.cfg.slow_persist,
                            self.cfg.slow_hold_s,
                            lambda k: excess(comm, comm.cells[k]) >= doubt,
                            lambda k: self.model.components(comm, comm.cells[k]))
        if bad:
            # every bad key is a cell of comm's (the filter types it)
            values: dict[Hashable, float] = {k: comm.cells[k].slow_value for k in bad
                                             if k in comm.cells}
            found, rest = localise.peel(bad, cells, self.cfg.localise_confidence, values,
                                        self.cfg.slow_ratio)
            out += [self._finding(comm, ranked, now) for ranked in found]
            if rest and rest[0].split > 1:
                rest = self._pooled(comm, rest[0], cells, found, now) or rest
            if rest:
                out.append(self._finding(comm, rest, now))
        return [f for f in out if f is not None]  # None: one fault, named already

    def _shares(self, comm: Comm, fresh: list[Cell]) -> None:
        """Each fresh cell's load share (Cell.share) from the paths of the communicator's
        fresh cells, and comm.share where the cells move data at their shares. Placing the
        cells here also restarts the history of those C4P moved (Model.place) before any is
        judged."""
        load: Counter[str] = Counter()
        moved = False  # a placed connection placed anew (a plan moved or reconnected it)
        for c in fresh:
            comps = self.model.components(comm, c)
            if comps is None:
                c.units = None
            elif c.units is None or c.units[0] is not comps:  # placed anew
                moved |= c.units is not None
                c.units = (comps, link_units(comps))
            if c.units:
                load.update(c.units[1])
        gbps = {u: self._capacity(u) for u in load}
        if not all(gbps.values()):  # capacities unknown: counts alone
            gbps = dict.fromkeys(load, 1.0)
        known: list[tuple[float, float]] = []  # (log value, log share)
        for c in fresh:
            on = c.units[1] if c.units else None
            share = math.log(max(load[x] / gbps[x] for x in on)) if on else None
            if moved and share is not None and c.share is not None and \
                    abs(share - c.share) > math.log(MARGINAL_MIN_RATIO):
                # others moved onto or off its links (a C4P plan): the load-share prediction
                # is a model, and its error on the new load is no slowness that arrived (lab
                # run K: after a plan put a third connection on leaf01-spine01 and
                # leaf02-spine01, their unmoved connections ran 1.5-2x what it predicts, and
                # the marginal rule named leaf01-spine01 as in a CI run). Only then: a share
                # that changes because connections fall idle (a slow link starves the ring's
                # reports) keeps the history that names the slow link
                c.rebase()
            c.share = share
            if c.share is not None:
                known.append((math.log(c.value), c.share))
        comm.share = None
        if len(known) < self.cfg.min_cells:
            return
        # The connections move data at their shares (links bound them) or at the job's pace
        # (their shares do not matter): whichever spreads the middle half of them less (a
        # lower baseline sees only the fastest quarter, often all on equal shares); equal
        # shares tie: the baseline.
        per_share = [v - sh for v, sh in known]
        if _iqr(per_share) < _iqr([v for v, _ in known]):
            comm.share = lower_baseline(per_share)

    def _capacity(self, unit: str) -> float:
        got = self.gbps.get(unit)
        if got is None:
            topo = self.model.topology
            lk = topo.links.get(localise.link_name(unit)[0]) if topo is not None else None
            got = self.gbps[unit] = max(lk.gbps, 0.0) if lk is not None else 0.0
        return got

    def _pooled(self, comm: Comm, top: localise.Hypothesis,
                cells: dict[Hashable, list[localise.Component]],
                found: list[list[localise.Hypothesis]],
                now: float) -> list[localise.Hypothesis] | None:
        """Unrelated components explain this job's bad connections equally (a ring's host
        pair: the up link at one end, the down link at the other): other jobs' connections
        through them, each judged against its own job, separate them. Persistently slow ones
        are evidence for, healthy ones against (keys: (comm, src, dst))."""
        comps = {c for k in top.bad for c in cells[k]}
        pool = {k: v for k, v in cells.items() if k not in {b for r in found for b in r[0].bad}}
        bad = set(top.bad)
        doubt = 0.5 * math.log(self.cfg.slow_ratio)
        for other in self.model.comms.values():
            if other is comm or other.baseline is None:
                continue
            window = FRESH_INTERVALS * other.interval
            for c in other.cells.values():
                if now - c.seen > window:
                    continue
                slow = c.persistent(self.cfg.slow_persist, self.cfg.slow_hold_s)
                if not slow and (c.streak or excess(other, c) >= doubt):
                    continue  # evidence of neither
                oc = self.model.components(other, c)
                if oc is None or comps.isdisjoint(oc):
                    continue
                key = (other.comm, c.src, c.dst)
                pool[key] = oc
                if slow:
                    bad.add(key)
        if len(pool) == len(cells):
            return None
        ranked = localise.rank(bad, pool, frozenset((r[0].kind, r[0].id) for r in found))
        if not ranked or ranked[0].posterior < self.cfg.localise_confidence or \
                not any(k in top.bad for k in ranked[0].bad):
            return None
        return ranked

    def _marginal(self, comm: Comm, fresh: list[Cell], now: float) -> list[Finding | None]:
        """Slowness below the per-report threshold (a NIC at 80-90 % of its rate), judged over
        each cell's last MARGINAL_REPORTS reports against the job's other cells: the median
        deviation is MARGINAL_Z standard errors above the job's median cell (its own spread,
        or the job's, whichever is larger), and most of its reports are above it (a burst of
        congestion lifts a few reports a lot; a slow NIC lifts all of them a little). Spoken
        only when the vote names a component: an elevated lone connection is not a fault."""
        meds = {(c.src, c.dst): (median(list(c.devs)), c) for c in fresh
                if len(c.devs) >= MARGINAL_MIN_REPORTS}
        if len(meds) < self.cfg.min_cells:
            return []
        center = median([m for m, _ in meds.values()])
        for med, c in meds.values():
            if c.first_excess is None:
                c.first_excess = med - center
        # A connection slow in slow_persist of its last reports sets the job's pace, so the
        # other cells no longer measure their own links (lab: leaf03-spine01 at 10 Mbit/s
        # lifted two connections leaf01 -> leaf00 to 1.6x their share for 20 reports, and
        # leaf00-spine01 was named beside it; the per-report hold, whose span the paced
        # job's moving expectation breaks now and then, was too strict a test of it). A
        # fault this slight is judged once that one heals (and the slow one's history then
        # starts anew: on_report).
        if any(c.streak >= self.cfg.slow_persist for c in fresh):
            return []
        bad: set[Hashable] = set()
        cells: dict[Hashable, list[localise.Component]] = {}
        for key, (med, c) in meds.items():
            if c.streak:
                continue  # slow now: the per-report detector's, evidence of neither here
            devs = list(c.devs)
            spread = max(expected(comm, c)[1], 1.4826 * median([abs(d - med) for d in devs]))
            thr = max(math.log(MARGINAL_MIN_RATIO),
                      MARGINAL_Z * 1.2533 * spread / math.sqrt(len(devs)))
            above = sum(d > center for d in devs) / len(devs)
            # what arrived since it was first judged: a link the job's own traffic loads most
            # waits longest from the start (the 16-host lab's ring: its busiest link's
            # connections 3-4x what their load share predicts, from the first report)
            excess = med - center - max(0.0, c.first_excess or 0.0)  # set above
            if excess >= thr and above >= MARGINAL_ABOVE:
                bad.add(key)
            elif excess >= thr / 2:
                continue  # evidence of neither
            comps = self.model.components(comm, c)
            if comps is not None:
                cells[key] = comps
        bad &= set(cells)
        found = localise.peel(bad, cells, self.cfg.localise_confidence)[0] if bad else []
        runs = comm.marginal_runs
        for ranked in found:
            comp = (ranked[0].kind, ranked[0].id)
            first, last = runs.get(comp, (now, now))
            runs[comp] = (first if now - last <= 2 * comm.interval else now, now)
        for comp in [k for k, (_, last) in runs.items() if now - last > 2 * comm.interval]:
            del runs[comp]
        return [self._finding(comm, ranked, now, center) for ranked in found
                if now - runs[(ranked[0].kind, ranked[0].id)][0] >=
                MARGINAL_HOLD * comm.interval]

    def _finding(self, comm: Comm, ranked: list[localise.Hypothesis], now: float,
                 marginal: float | None = None) -> Finding | None:
        """marginal: the job's median cell deviation, when judged over recent reports. None:
        a component named earlier explains all these connections (one fault)."""
        top = ranked[0]
        # this job's connections; other jobs' ones (comm, src, dst) only voted (_pooled)
        bad = [k for k in top.bad if k in comm.cells]
        base_gb = math.exp(comm.baseline[0]) * 1e9 if comm.baseline else 0.0
        # what is expected of them: the job's baseline, or what their load shares predict
        exp_gb = median([math.exp(expected(comm, comm.cells[k])[0]) * 1e9 for k in bad]) \
            if comm.baseline else 0.0
        if marginal is not None:
            ratio = math.exp(median([median(list(comm.cells[k].devs)) for k in bad]) -
                             marginal)
            slow_gb = exp_gb * ratio
        else:
            slow_gb = median([comm.cells[k].slow_value * 1e9 for k in bad])
            ratio = slow_gb / exp_gb if exp_gb else 0.0
        suspects, named, aliases = localise.name(top, nic_path(comm, bad))
        supersedes: tuple[str, ...] = ()
        if suspects[0].kind != "path" and suspects[0].confidence >= self.cfg.localise_confidence:
            earlier = self._one_fault(comm, top, bad, suspects[0].key, now)
            if earlier is None:
                return None
            supersedes = earlier
        conns = [f"{k[0]}->{k[1]}" for k in bad[:8]]
        paths = {k: comm.cells[k].path for k in bad}
        evidence: dict[str, Any] = {
            "slow_connections": top.n_bad,
            "connections_through_suspect": top.n_all,
            "baseline_s_per_gb": round(base_gb, 5),
            "slow_s_per_gb": round(slow_gb, 5),
            "ratio": round(ratio, 2),
            "connections": conns,
            **named,
            "paths_voting": localise.votes(bad, paths),
            "counters": self.counters.corroborate(comm, [comm.cells[k] for k in bad]),
        }
        if comm.share is not None:
            evidence["expected_s_per_gb"] = round(exp_gb, 5)
        if len(bad) < top.n_bad:
            evidence["other_jobs_slow_connections"] = top.n_bad - len(bad)
        what = describe(suspects[0], self.cfg.localise_confidence)
        span = f"{ratio:.1f}x"
        if marginal is not None:
            reports = min(len(comm.cells[k].devs) for k in bad)
            evidence["marginal_reports"] = reports
            span = f"{ratio:.2f}x (median of their last {reports} reports)"
        against = "the job's network time per byte" if comm.share is None else \
            "the network time per byte their links' load share predicts"
        summary = (f"{top.n_bad} connection(s) move data at {span} {against} ({slow_gb:.3f} "
                   f"vs {exp_gb:.3f} s/GB); suspect: {what}")
        if evidence["counters"]:
            summary += "; NIC counters corroborate"
        first = now - MARGINAL_REPORTS * comm.interval if marginal is not None else \
            min(comm.cells[k].since for k in bad)
        return Finding("comm_slow", comm.job, comm.comm, suspects, summary, evidence, first,
                       matrix=matrix(comm, bad), aliases=aliases, supersedes=supersedes)

    def _one_fault(self, comm: Comm, top: localise.Hypothesis, bad: list[tuple[int, int]],
                   key: str, now: float) -> tuple[str, ...] | None:
        """One fault, one incident, while its evidence grows: a starved host slows its sends
        before the acknowledgements of what it receives, and its sends alone may be all a
        link carries. The keys of components named for this job within `resolve_hold_s` whose
        connections all pass through this one (the same fault, better named now), or None
        when one of them explains all of this finding's (and at least as many)."""
        names = frozenset([f"{top.kind}:{top.id}", *top.aliases])
        supersedes = []
        for other, (cells, theirs, at) in list(comm.slow_named.items()):
            if now - at > self.cfg.resolve_hold_s:
                del comm.slow_named[other]
                continue
            cells = [k for k in cells if k in comm.cells]
            if other == key or not cells:
                continue
            ours, explained = self._through(comm, names, cells), self._through(comm, theirs, bad)
            if ours and not (explained and len(bad) <= len(cells)):
                supersedes.append(other)
                del comm.slow_named[other]
            elif explained:
                return None
        comm.slow_named[key] = (list(bad), names, now)
        return tuple(supersedes)

    def _through(self, comm: Comm, names: frozenset[str], keys: list[tuple[int, int]]) -> bool:
        """Whether every one of these connections passes through one of the components."""
        for k in keys:
            comps = self.model.components(comm, comm.cells[k]) or ()
            if names.isdisjoint(f"{c[0]}:{c[1]}" for c in comps):
                return False
        return True


def _iqr(xs: list[float]) -> float:
    s = sorted(xs)
    return quantile(s, 0.75) - quantile(s, 0.25)


def expected(comm: Comm, cell: Cell) -> tuple[float, float]:
    """(log s/B expected of the cell's reports, their sigma about it): the job's baseline, or
    where its connections move data at their load shares, what the cell's share gives."""
    assert comm.baseline is not None
    if comm.share is None or cell.share is None:
        return comm.baseline
    return comm.share[0] + cell.share, comm.share[1]


def excess(comm: Comm, cell: Cell) -> float:
    """log(the cell's last value / what is expected of it)."""
    return math.log(cell.value) - expected(comm, cell)[0]


def link_units(comps: list[localise.Component]) -> list[str]:
    """The links of a connection's path that carry its load: each cable in the direction it
    takes (either, where the direction is unknown)."""
    links = [c[1] for c in comps
             if c[0] == "link" and c[3] in (localise.PRIO_FABRIC, localise.PRIO_ACCESS)]
    one_way = {localise.link_name(lk)[0] for lk in links if localise.link_name(lk)[1]}
    return [lk for lk in links if localise.link_name(lk)[1] or lk not in one_way]


def nic_path(comm: Comm, keys: Sequence[tuple[int, int]]) -> str | None:
    """The path of connections that all join the same two NICs (NIC -> NIC), or the same two
    hosts (host -> host)."""
    nics, hosts = set(), set()
    for src, dst in keys:
        s, d = comm.ranks.get(src), comm.ranks.get(dst)
        if s is None or d is None:
            return None
        nics.add(f"{s.nic or s.host}->{d.nic or d.host}")
        hosts.add(f"{s.host}->{d.host}")
    return nics.pop() if len(nics) == 1 else hosts.pop() if len(hosts) == 1 else None


def matrix(comm: Comm, focus_cells: Sequence[tuple[int, int]]) -> dict[str, Any] | None:
    """Seconds per GB around the suspect cells, for the terminal heatmap."""
    if not focus_cells:
        return None
    worst = max(focus_cells, key=lambda k: comm.cells[k].value)
    labels: list[int] = []
    for src, dst in [worst] + list(focus_cells):
        for r in (src, dst):
            if r not in labels and len(labels) < MATRIX_LABELS * 2 // 3:
                labels.append(r)
    for r in list(labels):  # healthy neighbours give the contrast
        rk = comm.ranks.get(r)
        for p in sorted(rk.peers) if rk else ():
            if p not in labels and len(labels) < MATRIX_LABELS:
                labels.append(p)
    labels.sort()
    idx = {r: i for i, r in enumerate(labels)}
    cells: list[list[float | None]] = [[None] * len(labels) for _ in labels]
    for (src, dst), c in comm.cells.items():
        if src in idx and dst in idx and c.seen > -1e17:
            cells[idx[src]][idx[dst]] = round(c.value * 1e9, 4)
    names = []
    for r in labels:
        rk = comm.ranks.get(r)
        names.append(f"{r}@{rk.host}" if rk else str(r))
    return {"labels": names, "cells": cells, "focus": [idx[worst[0]], idx[worst[1]]]}

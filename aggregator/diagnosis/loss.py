"""Packet loss from NIC counters, as evidence in its own right (not only to corroborate a slow
cell): 0.05 % loss barely slows a connection, but every lost packet shows in its receiver's
`out_of_sequence` (go-back-N drops the rest of the window) and lost tails in its sender's
`local_ack_timeout_err`.

A NIC's counters do not say which of its connections lost packets, so each NIC end is one
observation: its receive side (rx counters) covers the connections it receives, its send side
(tx counters) those it sends, each through the directed components of their paths. A lossy
direction of a cable predicts exactly the NIC ends of the connections crossing it that way to
count loss; ends that carry traffic and count none clear everything their connections cross.
The same vote as slow cells (localise.peel) names the component. All jobs' connections vote
together: counters are per NIC, whichever job's traffic they count.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Hashable

from c4.core.catalog import ROCE_SIGNALS
from c4.core.topology import endpoint

from . import localise
from .config import DiagnosisConfig
from .counters import port_rates
from .findings import Finding
from .model import Cell, Comm, Model, SlowWindow
from .slow import FRESH_INTERVALS, describe, nic_path
from .stats import quantile

# The loss counters by the end of a flow that counts them (c4.core.catalog).
LOSS: dict[str, tuple[str, ...]] = {
    end: tuple(n for n, (e, sym, _) in ROCE_SIGNALS.items() if e == end and sym == "loss")
    for end in ("rx", "tx")}
LOSS_NAMES = LOSS["rx"] + LOSS["tx"]


class End(SlowWindow):
    """One side (rx or tx) of one NIC: its loss rate and how persistently it stands out (the
    same window as a slow connection's)."""

    __slots__ = ("rate", "seen", "bad_rate")

    def __init__(self) -> None:
        super().__init__()
        self.rate = 0.0
        self.seen = -1e18
        self.bad_rate = 0.0  # its rate in the last report that stood out


class LossDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model) -> None:
        self.cfg = cfg
        self.model = model
        self.mask = (1 << cfg.slow_window) - 1
        self.ends: dict[tuple[str, str], End] = {}  # (rx | tx, NIC endpoint)
        self.floor = {"rx": float("inf"), "tx": float("inf")}  # per end, from the last tick
        self.interval = 1.0

    def on_rdma(self, host: str, section: dict[str, Any], interval: float, now: float) -> None:
        self.interval = interval or self.interval
        for port in section.get("ports", []):
            rates = port_rates(port, LOSS_NAMES, interval)
            nic = endpoint(host, port["dev"])
            for end, names in LOSS.items():
                e = self.ends.get((end, nic))
                if e is None:
                    e = self.ends[(end, nic)] = End()
                e.rate = sum(rates.get(n, 0.0) for n in names)
                e.seen = now
                bad = e.rate >= self.floor[end]
                if bad:
                    e.bad_rate = e.rate
                e.push(bad, now, self.mask)

    def tick(self, now: float) -> list[Finding]:
        fresh = FRESH_INTERVALS * self.interval
        carried: dict[Hashable, list[tuple[Comm, Cell]]] = {}  # end -> its fresh connections
        for comm in self.model.comms.values():
            for cell in comm.cells.values():
                if now - cell.seen > fresh:
                    continue  # no data lately: its ends say nothing about it
                s, d = comm.ranks.get(cell.src), comm.ranks.get(cell.dst)
                if s is None or d is None or self.model.components(comm, cell) is None:
                    continue
                for key in (("tx", s.nic), ("rx", d.nic)):
                    if key[1] is not None and key in self.ends:
                        carried.setdefault(key, []).append((comm, cell))
        live = {k: self.ends[k] for k in carried if now - self.ends[k].seen <= fresh}  # type: ignore[index]
        for end in ("rx", "tx"):
            rates = sorted(e.rate for (x, _), e in live.items() if x == end)
            # most NICs count no loss; a lossy link can reach many, so the lower quartile
            base = quantile(rates, 0.25) if rates else 0.0
            self.floor[end] = max(self.cfg.counter_min_rate, self.cfg.counter_ratio * base)
        bad = {k for k, e in live.items()
               if e.persistent(self.cfg.slow_persist, self.cfg.slow_hold_s)}
        if not bad:
            return []
        # ends that count loss now but not persistently are evidence of neither
        # what each end's connections cross (cell.comps: set by model.components above), built
        # only when some end counts loss
        cells = {k: sorted({c for _, cell in carried[k] for c in cell.comps})
                 for k, e in live.items() if k in bad or not e.hist}
        found, rest = localise.peel(bad, cells, self.cfg.localise_confidence)
        out = [self._finding(r[0], carried, now) for r in found]
        if rest:
            out.append(self._finding(rest[0], carried, now))
        return out

    def _finding(self, top: localise.Hypothesis,
                 carried: dict[Hashable, list[tuple[Comm, Cell]]], now: float) -> Finding:
        comp = next(c for k in top.bad for _, cell in carried[k]
                    for c in cell.comps if (c[0], c[1]) == (top.kind, top.id))
        # the connections of the counting ends that cross the suspect
        conns = [(comm, cell) for k in top.bad for comm, cell in carried[k] if comp in cell.comps]
        conns = list({id(c): (m, c) for m, c in conns}.values())
        jobs = Counter(comm.job for comm, _ in conns)
        job = jobs.most_common(1)[0][0] if jobs else None
        comm = next((m for m, _ in conns if m.job == job), None)
        path = nic_path(comm, [(c.src, c.dst) for m, c in conns]) \
            if comm is not None and all(m is comm for m, _ in conns) else None
        suspects, named, aliases = localise.name(top, path)
        counts = {f"{nic} {end}": round(self.ends[(end, nic)].bad_rate, 1)
                  for end, nic in sorted(top.bad)[:8]}  # type: ignore[misc]
        ev: dict[str, Any] = {
            "loss_counters": counts,
            "counting_nic_ends": top.n_bad,
            "nic_ends_through_suspect": top.n_all,
            "connections": [f"{c.src}->{c.dst}" for _, c in conns[:8]],
            **named,
        }
        names = "/".join(sorted({n for v in LOSS.values() for n in v}))
        summary = (f"{top.n_bad} NIC end(s) count packet loss ({names}) on connections that "
                   f"cross one component, {top.n_all - top.n_bad} clean; suspect: "
                   f"{describe(suspects[0], self.cfg.localise_confidence)}")
        first = min(self.ends[k].since for k in top.bad)  # type: ignore[index]
        return Finding("comm_slow", job, comm.comm if comm else None, suspects, summary, ev,
                       first, aliases=aliases)

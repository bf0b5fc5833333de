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
from .findings import Finding, describe
from .model import Cell, Comm, Model, Rank, SlowWindow, ballot
from .slow import FRESH_INTERVALS, nic_path
from .stats import quantile

# The loss counters by the end of a flow that counts them (c4.core.catalog).
LOSS: dict[str, tuple[str, ...]] = {
    end: tuple(n for n, (e, sym, _) in ROCE_SIGNALS.items() if e == end and sym == "loss")
    for end in ("rx", "tx")}
LOSS_NAMES = LOSS["rx"] + LOSS["tx"]


class End(SlowWindow):
    """One side (rx or tx) of one NIC: its loss rate, how persistently it stands out (the
    same window as a slow connection's), and the connections it carries (kept up to date as
    their reports arrive: a tick does no work per connection unless some end counts loss)."""

    __slots__ = ("rate", "seen", "bad_rate", "carried", "conns")
    BREAKS = False

    def __init__(self) -> None:
        super().__init__()
        self.rate = 0.0
        self.seen = -1e18
        self.bad_rate = 0.0  # its rate in the last report that stood out
        self.carried = -1e18  # arrival of the latest report of a connection through it with data
        self.conns: dict[tuple[str, int, int], tuple[Comm, Cell]] = {}  # (comm, src, dst)


SWEEP_S = 60.0  # how often connections that stopped moving data are dropped from their ends


class LossDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model) -> None:
        self.cfg = cfg
        self.model = model
        self.mask = (1 << cfg.slow_window) - 1
        self.ends: dict[tuple[str, str], End] = {}  # (rx | tx, NIC endpoint)
        self.floor = {"rx": float("inf"), "tx": float("inf")}  # per end, from the last tick
        self.interval = 1.0
        self.swept = 0.0

    def _end(self, key: tuple[str, str]) -> End:
        e = self.ends.get(key)
        if e is None:
            e = self.ends[key] = End()
        return e

    def on_rdma(self, host: str, section: dict[str, Any], interval: float, now: float) -> None:
        self.interval = interval or self.interval
        for port in section.get("ports", []):
            rates = port_rates(port, LOSS_NAMES, interval)
            nic = endpoint(host, port["dev"])
            for end, names in LOSS.items():
                e = self._end((end, nic))
                e.rate = sum(rates.get(n, 0.0) for n in names)
                e.seen = now
                bad = e.rate >= self.floor[end]
                if bad:
                    e.bad_rate = e.rate
                e.push(bad, now, self.mask)

    def on_sends(self, comm: Comm, rk: Rank, now: float) -> None:
        """A rank's report: its send connections that moved data are carried by its NIC's tx
        end and their receiver's rx end."""
        tx = self._end(("tx", rk.nic)) if rk.nic else None
        for dst, (nbytes, _) in rk.sends.items():
            cell = comm.cells.get((rk.rank, dst))
            d = comm.ranks.get(dst)
            if nbytes < self.cfg.min_cell_bytes or cell is None or d is None:
                continue
            key = (comm.comm, rk.rank, dst)
            for e in (tx, self._end(("rx", d.nic)) if d.nic else None):
                if e is not None:
                    e.conns[key] = (comm, cell)
                    e.carried = now

    def tick(self, now: float) -> list[Finding]:
        fresh = FRESH_INTERVALS * self.interval
        if now - self.swept >= SWEEP_S:
            self._sweep(now)
        # ends that count and carry connections that moved data lately
        live = {k: e for k, e in self.ends.items()
                if now - e.seen <= fresh and now - e.carried <= fresh}
        for end in ("rx", "tx"):
            rates = sorted(e.rate for (x, _), e in live.items() if x == end)
            # most NICs count no loss; a lossy link can reach many, so the lower quartile
            base = quantile(rates, 0.25) if rates else 0.0
            self.floor[end] = max(self.cfg.counter_min_rate, self.cfg.counter_ratio * base)
        carried: dict[Hashable, list[tuple[Comm, Cell]]] = {}  # end -> its fresh connections

        def components(key: tuple[str, str]) -> list[localise.Component] | None:
            e = live[key]
            conns = carried[key] = [
                (m, c) for m, c in e.conns.values()
                if now - c.seen <= fresh and self._through(m, c, key)
                and self.model.components(m, c) is not None]
            return list(dict.fromkeys(x for _, c in conns for x in c.comps)) or None

        # an end that counts loss now but not persistently is evidence of neither
        bad, cells = ballot(live, self.cfg.slow_persist, self.cfg.slow_hold_s,
                            lambda k: False, components)
        if not bad:
            return []
        found, rest = localise.peel(bad, cells, self.cfg.localise_confidence)
        out = [self._finding(r[0], carried, now) for r in found]
        if rest:
            out.append(self._finding(rest[0], carried, now))
        return out

    @staticmethod
    def _through(comm: Comm, cell: Cell, key: tuple[str, str]) -> bool:
        """The connection still runs through this end (its rank's NIC did not change)."""
        rk = comm.ranks.get(cell.src if key[0] == "tx" else cell.dst)
        return rk is not None and rk.nic == key[1]

    def forget_hosts(self, hosts: set[str]) -> None:
        for key in [k for k in self.ends if k[1].partition("/")[0] in hosts]:
            del self.ends[key]

    def _sweep(self, now: float) -> None:
        """Drop connections that moved no data for SWEEP_S, or whose communicator ended."""
        self.swept = now
        for e in self.ends.values():
            for k in [k for k, (m, c) in e.conns.items()
                      if now - c.seen > SWEEP_S or self.model.comms.get(m.comm) is not m]:
                del e.conns[k]

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
                  for end, nic in sorted(k for k in top.bad if k in self.ends)[:8]}
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
        # every bad key is an end (the filter types it)
        first = min(self.ends[k].since for k in top.bad if k in self.ends)
        return Finding("comm_slow", job, comm.comm if comm else None, suspects, summary, ev,
                       first, aliases=aliases)

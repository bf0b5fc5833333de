"""Per-host state: inventory, liveness, sequence bookkeeping, the latest report sections.

Times here are the aggregator's own clock (`now` passed in: simulated in replay); agent
timestamps are kept only for display, never compared across hosts.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from c4.core.catalog import ROCE_SIGNALS

EVENTS_KEPT = 50


@dataclass
class SeqState:
    """Which frames of one (host, boot) are stored: everything <= contiguous, plus `above`."""

    contiguous: int = 0
    above: set[int] = field(default_factory=set)
    lost: int = 0

    def seen(self, seq: int) -> bool:
        return seq <= self.contiguous or seq in self.above

    def add(self, seq: int) -> None:
        """Mark `seq` stored (in memory: Ingest.flush snapshots and restores on a failed commit)."""
        self.above.add(seq)
        self._advance()

    def settle_below(self, floor: int) -> None:
        """The sender no longer holds anything below `floor`: stop waiting for it."""
        if floor - 1 <= self.contiguous:
            return
        # Work in proportion to what is stored, never to the gap a peer claims (a floor of
        # 2^62 must not mean 2^62 steps under the ingest lock).
        settled = [s for s in self.above if s < floor]
        self.lost += floor - 1 - self.contiguous - len(settled)
        self.above.difference_update(settled)
        self.contiguous = floor - 1
        self._advance()

    def _advance(self) -> None:
        while self.contiguous + 1 in self.above:
            self.contiguous += 1
            self.above.discard(self.contiguous)


@dataclass
class HostState:
    name: str
    boot: str = ""
    hello: dict[str, Any] = field(default_factory=dict)
    first_seen: float = 0.0
    last_seen: float = 0.0
    last_agent_ts: float = 0.0
    status: str = "up"  # up | silent
    reports: int = 0
    last_report: dict[str, Any] = field(default_factory=dict)
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    seqs: dict[str, SeqState] = field(default_factory=dict)
    rejected: int = 0

    @property
    def interval(self) -> float:
        return float(self.hello.get("interval", 1.0))

    def summary(self, now: float) -> dict[str, Any]:
        report = self.last_report
        health = report.get("health") or self.hello.get("collectors", {})
        ports = (report.get("rdma") or {}).get("ports", [])
        rates: dict[str, float] = {}
        for p in ports:
            for k in ROCE_SIGNALS:
                if k in p.get("rates", {}):
                    rates[k] = rates.get(k, 0.0) + p["rates"][k]
        seq = self.seqs.get(self.boot, SeqState())
        return {
            "name": self.name,
            "status": self.status,
            "agent_version": self.hello.get("agent_version"),
            "last_seen_age_s": round(max(0.0, now - self.last_seen), 3),
            "last_seen": self.last_seen,
            "interval": self.interval,
            "reports": self.reports,
            "nics": len(self.hello.get("nics", [])),
            "ports": len(ports),
            "ports_active": sum(1 for p in ports if p.get("state") == "ACTIVE"),
            "collectors_ok": sorted(n for n, h in health.items() if h.get("ok")),
            "collectors_down": sorted(n for n, h in health.items() if not h.get("ok")),
            "rates": rates,
            "seq": {"contiguous": seq.contiguous, "lost": seq.lost},
        }

    def detail(self, now: float) -> dict[str, Any]:
        d = self.summary(now)
        d.update({
            "first_seen": self.first_seen,
            "last_agent_ts": self.last_agent_ts,
            # Boot ids stay inside: with them a peer could forge frames that look in sequence
            # (the API is unauthenticated; docs/security.md).
            "hello": {k: v for k, v in self.hello.items() if k != "kernel_boot_id"},
            "report": self.last_report,
            "events": list(self.events),
            "rejected": self.rejected,
        })
        return d


class HostRegistry:
    def __init__(self) -> None:
        self.hosts: dict[str, HostState] = {}

    def get(self, name: str) -> HostState:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = HostState(name)
        return h

    def silent_deadline(self, h: HostState, silent_after: float) -> float:
        return h.last_seen + (silent_after or max(5.0, 5 * h.interval))

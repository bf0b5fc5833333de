"""Per-interval deltas and rates of monotonic counters (sysfs RDMA counters, ethtool stats).

A counter that goes backwards was reset (driver reload, `ethtool` reset, firmware reset) or
wrapped; its delta is then its new value, the increase we can prove since the reset, and it
is listed in `resets` so readers know the delta is a lower bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Change:
    deltas: dict[str, int] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # empty when no time passed
    resets: list[str] = field(default_factory=list)


class CounterTracker(Generic[K]):
    """Remembers the previous sample of each source (a port, a netdev) to diff the next one."""

    def __init__(self) -> None:
        self._prev: dict[K, tuple[float, dict[str, int]]] = {}

    def update(self, key: K, now: float, values: Mapping[str, int]) -> Change | None:
        """Store `values` for `key`; return the change since its previous sample, or None for
        the first one. Counters missing from either sample get no delta."""
        prev = self._prev.get(key)
        self._prev[key] = (now, dict(values))
        if prev is None:
            return None
        then, old = prev
        dt = now - then
        change = Change()
        for name, value in values.items():
            before = old.get(name)
            if before is None:
                continue
            if value < before:
                change.resets.append(name)
                delta = value
            else:
                delta = value - before
            change.deltas[name] = delta
            if dt > 0:
                change.rates[name] = delta / dt
        return change

    def retain(self, keys: set[K]) -> list[K]:
        """Forget sources not in `keys` (they disappeared); return the forgotten keys."""
        gone = [k for k in self._prev if k not in keys]
        for k in gone:
            del self._prev[k]
        return gone

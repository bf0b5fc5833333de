"""The learned path map (src, dst, proto, sport) -> links, fed by probe results. `proto` is
the flow's path class (model.path_class): `roce`, or `tcp:<dport>` since ECMP hashes the
destination port too.

Keys use topology endpoints (`host/dev`); a path is the tuple of link ids from src to dst.
An entry is trusted until it is older than `ttl_s`, until a link on it has an incident (the
fabric may have rerouted it) or until the topology changes (`clear`). `changed_since` names
the keys whose knowledge changed, so the planner's model rebuilds only those.
"""
from __future__ import annotations

from dataclasses import dataclass

Key = tuple[str, str, str]  # (src endpoint, dst endpoint, proto)


@dataclass
class Entry:
    links: tuple[str, ...]
    learned: float


class PathMap:
    def __init__(self, ttl_s: float = 3600.0) -> None:
        self.ttl_s = ttl_s
        self.entries: dict[Key, dict[int, Entry]] = {}
        self.by_link: dict[str, set[tuple[Key, int]]] = {}
        self.log: list[Key] = []  # keys in the order they changed
        self.epoch = 0  # a new epoch: the log was reset, every key may have changed
        self.oldest = float("inf")  # no entry was learned before this: expire() waits for it

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())

    def learn(self, src: str, dst: str, proto: str, sport: int, links: tuple[str, ...],
              now: float) -> None:
        key = (src, dst, proto)
        old = self.entries.get(key, {}).get(sport)
        if old is not None:
            self._unindex(key, sport, old.links)
        self.entries.setdefault(key, {})[sport] = Entry(tuple(links), now)
        self.oldest = min(self.oldest, now)
        for lk in links:
            self.by_link.setdefault(lk, set()).add((key, sport))
        self._changed(key)

    def _changed(self, key: Key) -> None:
        if len(self.log) > 4 * len(self.entries) + 1024:
            self._reset_log()
        self.log.append(key)

    def _reset_log(self) -> None:
        self.log = []
        self.epoch += 1

    def changed_since(self, mark: tuple[int, int]) -> set[Key] | None:
        """Keys changed since `mark` (a `mark()` taken earlier); None: possibly all."""
        epoch, at = mark
        return set(self.log[at:]) if epoch == self.epoch else None

    def mark(self) -> tuple[int, int]:
        return self.epoch, len(self.log)

    def fresh_until(self, key: Key) -> float:
        """When the oldest entry of `key` stops being trusted (inf: none)."""
        got = self.entries.get(key)
        return min(e.learned for e in got.values()) + self.ttl_s if got else float("inf")

    def _unindex(self, key: Key, sport: int, links: tuple[str, ...]) -> None:
        for lk in links:
            s = self.by_link.get(lk)
            if s is not None:
                s.discard((key, sport))
                if not s:
                    del self.by_link[lk]

    def forget_link(self, link: str) -> int:
        """Drop every entry whose path uses `link`; returns how many."""
        gone = self.by_link.pop(link, set())
        for key, sport in gone:
            e = self.entries.get(key, {}).pop(sport, None)
            if e is not None:
                self._unindex(key, sport, e.links)
                self._changed(key)
            if key in self.entries and not self.entries[key]:
                del self.entries[key]
        return len(gone)

    def clear(self) -> None:
        self.entries.clear()
        self.by_link.clear()
        self.oldest = float("inf")
        self._reset_log()

    def ports(self, src: str, dst: str, proto: str, now: float) -> dict[int, tuple[str, ...]]:
        """Known source ports of (src, dst, proto) and the path each takes (fresh ones only)."""
        got = self.entries.get((src, dst, proto), {})
        return {p: e.links for p, e in got.items() if now - e.learned <= self.ttl_s}

    def lookup(self, src: str, dst: str, proto: str, sport: int,
               now: float) -> tuple[str, ...] | None:
        e = self.entries.get((src, dst, proto), {}).get(sport)
        return e.links if e is not None and now - e.learned <= self.ttl_s else None

    def expire(self, now: float) -> int:
        """Drop the entries older than the TTL (a scan only once the oldest one is)."""
        if now - self.oldest <= self.ttl_s:
            return 0
        old = [(k, p) for k, v in self.entries.items() for p, e in v.items()
               if now - e.learned > self.ttl_s]
        self.oldest = min((e.learned for v in self.entries.values() for e in v.values()
                           if now - e.learned <= self.ttl_s), default=float("inf"))
        for key, sport in old:
            e = self.entries[key].pop(sport)
            self._unindex(key, sport, e.links)
            self._changed(key)
            if not self.entries[key]:
                del self.entries[key]
        return len(old)

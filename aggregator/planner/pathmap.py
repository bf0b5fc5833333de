"""The learned path map (src, dst, proto, sport) -> links, fed by probe results. `proto` is
the flow's path class (model.path_class): `roce`, or `tcp:<dport>` since ECMP hashes the
destination port too.

Keys use topology endpoints (`host/dev`); a path is the tuple of link ids from src to dst.
An entry is trusted until it is older than `ttl_s`, until a link on it has an incident (the
fabric may have rerouted it) or until the topology changes (`clear`). `changed_since` names
the keys whose knowledge changed, so the planner's model rebuilds only those.
"""
from __future__ import annotations

import bisect

Key = tuple[str, str, str]  # (src endpoint, dst endpoint, proto)
Path = tuple[str, ...]


class Known:
    """One key's known ports: the path of each, when it was learned, and the ports of each
    path (a sorted tuple; paths in order), kept as ports are learned so that the planner's model reads a
    pair's candidates without going over its ports (docs/planning.md). Tuples of ints and
    strings, and dicts of them, cost the garbage collector nothing once it has seen them:
    a 16,384-GPU path map holds 300,000 ports."""

    __slots__ = ("path", "learned", "by_path")

    def __init__(self) -> None:
        self.path: dict[int, Path] = {}
        self.learned: dict[int, float] = {}
        self.by_path: dict[Path, tuple[int, ...]] = {}

    def add(self, sport: int, links: Path, now: float) -> None:
        self.drop(sport)
        self.path[sport] = links
        self.learned[sport] = now
        ports = self.by_path.get(links)
        if ports is None:  # a new path: paths stay sorted (a key has a few)
            last = next(reversed(self.by_path), None)
            self.by_path[links] = (sport,)
            if last is not None and links < last:
                self.by_path = dict(sorted(self.by_path.items()))
            return
        at = bisect.bisect(ports, sport)
        self.by_path[links] = ports[:at] + (sport,) + ports[at:]

    def drop(self, sport: int) -> Path | None:
        links = self.path.pop(sport, None)
        if links is not None:
            del self.learned[sport]
            ports = tuple(p for p in self.by_path[links] if p != sport)
            if ports:
                self.by_path[links] = ports
            else:
                del self.by_path[links]
        return links


class PathMap:
    def __init__(self, ttl_s: float = 3600.0) -> None:
        self.ttl_s = ttl_s
        self.entries: dict[Key, Known] = {}
        self.by_link: dict[str, set[tuple[Key, int]]] = {}
        self.log: list[Key] = []  # keys in the order they changed
        self.epoch = 0  # a new epoch: the log was reset, every key may have changed
        self.oldest = float("inf")  # no entry was learned before this: expire() waits for it

    def __len__(self) -> int:
        return sum(len(v.path) for v in self.entries.values())

    def learn(self, src: str, dst: str, proto: str, sport: int, links: Path,
              now: float) -> None:
        key = (src, dst, proto)
        known = self.entries.setdefault(key, Known())
        old = known.path.get(sport)
        if old is not None:
            self._unindex(key, sport, old)
        links = tuple(links)
        known.add(sport, links, now)
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

    def _unindex(self, key: Key, sport: int, links: Path) -> None:
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
            known = self.entries.get(key)
            links = known.drop(sport) if known is not None else None
            if links is not None:
                self._unindex(key, sport, links)
                self._changed(key)
            if known is not None and not known.path:
                del self.entries[key]
        return len(gone)

    def clear(self) -> None:
        self.entries.clear()
        self.by_link.clear()
        self.oldest = float("inf")
        self._reset_log()

    def ports(self, src: str, dst: str, proto: str, now: float) -> dict[int, Path]:
        """Known source ports of (src, dst, proto) and the path each takes (fresh ones only)."""
        got = self.entries.get((src, dst, proto))
        if got is None:
            return {}
        return {p: got.path[p] for p, t in got.learned.items() if now - t <= self.ttl_s}

    def by_path(self, key: Key, now: float) -> tuple[dict[Path, tuple[int, ...]], float]:
        """The fresh known ports of `key` by the path they take (paths and ports sorted), and when the oldest
        entry stops being trusted (inf: none). Read only: while every entry of the key
        is fresh, it is the map's own."""
        got = self.entries.get(key)
        if got is None:
            return {}, float("inf")
        until = min(got.learned.values()) + self.ttl_s
        if now <= until:
            return got.by_path, until
        out: dict[Path, tuple[int, ...]] = {}
        for p in sorted(got.path):
            if now - got.learned[p] <= self.ttl_s:
                out[got.path[p]] = out.get(got.path[p], ()) + (p,)
        return dict(sorted(out.items())), until

    def lookup(self, src: str, dst: str, proto: str, sport: int,
               now: float) -> Path | None:
        return self.path((src, dst, proto), sport, now)

    def path(self, key: Key, sport: int, now: float) -> Path | None:
        """The path `sport` of `key` takes, if known and fresh."""
        got = self.entries.get(key)
        t = got.learned.get(sport) if got is not None else None
        return got.path[sport] if got is not None and t is not None and \
            now - t <= self.ttl_s else None

    def expire(self, now: float) -> int:
        """Drop the entries older than the TTL (a scan only once the oldest one is)."""
        if now - self.oldest <= self.ttl_s:
            return 0
        old = [(k, p) for k, v in self.entries.items() for p, t in v.learned.items()
               if now - t > self.ttl_s]
        self.oldest = min((t for v in self.entries.values() for t in v.learned.values()
                           if now - t <= self.ttl_s), default=float("inf"))
        for key, sport in old:
            known = self.entries[key]
            links = known.drop(sport)
            assert links is not None
            self._unindex(key, sport, links)
            self._changed(key)
            if not known.path:
                del self.entries[key]
        return len(old)

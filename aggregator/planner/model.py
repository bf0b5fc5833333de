"""From what the aggregator knows (topology, flows, path map, link health) to a solver
`Instance`, and from the solver's choice back to a source port per flow."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

import numpy as np

from c4.core.topology import Topology

from .pathmap import PathMap
from .solver import Instance


MICE = 1e-3  # flows below this fraction of the largest flow's demand are not planned


@dataclass
class Flow:
    """One planned unit: a QP (`roce`) or a TCP connection, owned by a process on `host`."""

    id: str
    host: str
    src: str  # topology endpoint `host/dev`
    dst: str
    proto: str  # roce | tcp
    sport: int | None  # the port it uses now, if known
    demand: float  # bytes/s
    dport: int = 4791
    job: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # what the agent needs to find it

    @property
    def pclass(self) -> str:
        return path_class(self.proto, self.dport)

    @cached_property
    def key(self) -> tuple[str, str, str]:
        """(src, dst, path class): the path map's key; flows are never changed in place."""
        return self.src, self.dst, self.pclass


def path_class(proto: str, dport: int) -> str:
    """The path map's protocol key. ECMP hashes the destination port too, so a TCP port's
    path is learned per destination port (`tcp:29500`); RoCE's is always 4791."""
    return f"tcp:{dport}" if proto == "tcp" else proto


@dataclass
class Health:
    down: set[str] = field(default_factory=set)  # links no plan may use
    suspect: dict[str, str] = field(default_factory=dict)  # link -> why (lossy, congested)


@dataclass
class Built:
    inst: Instance | None
    flows: list[Flow]  # the planned flows, in instance order
    paths: list[list[tuple[str, ...]]]  # per planned flow: candidate paths (link ids)
    ports: list[list[list[int]]]  # per planned flow, per candidate: known ports
    current: list[int]  # per planned flow: candidate index of its current port, -1 unknown
    unplanned: list[tuple[Flow, str]]  # flows left alone, with the reason
    arcs: list[tuple[str, bool]]  # arc index -> (link id, forward)


class Arcs:
    """Directed links: index 2i is link i traversed a -> b, 2i+1 the other way."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.ids = list(topo.links)
        self.index = {lid: i for i, lid in enumerate(self.ids)}
        self.ends = {lid: (2 * i, lk.a, lk.b) for i, (lid, lk) in enumerate(topo.links.items())}
        self.gbps = np.repeat([topo.links[lid].gbps * 1e9 / 8 for lid in self.ids], 2)
        self.named = [(lid, d == 0) for lid in self.ids for d in (0, 1)]

    def of_path(self, path: tuple[str, ...]) -> tuple[int, ...]:
        """Arc indices along a path from its NIC port (the first access link's `a`)."""
        ends = self.ends
        i, cur, b = ends[path[0]]
        out = [i]
        cur = b
        for lid in path[1:]:
            i, a, b = ends[lid]
            if a == cur:
                out.append(i)
                cur = b
            elif b == cur:
                out.append(i + 1)
                cur = a
            else:
                raise ValueError(f"path {path}: {lid} does not continue it")
        return tuple(out)

    def caps(self, suspect: dict[str, str], suspect_factor: float) -> np.ndarray:
        """Bytes/s per arc (links are full duplex: each direction has the link's rate)."""
        cap = self.gbps.copy()
        for lid in suspect:
            i = self.index.get(lid)
            if i is not None:
                cap[2 * i:2 * i + 2] *= suspect_factor
        return cap

    def names(self) -> list[tuple[str, bool]]:
        return self.named


@dataclass
class _Pair:
    """What one (src, dst, proto) contributes: its known ports and candidate paths."""

    until: float  # when its oldest entry expires
    known: dict[int, tuple[str, ...]]
    links: frozenset[str]  # every link of a known path
    paths: list[tuple[str, ...]]  # usable (no down link), sorted
    ports: list[list[int]]
    arcs: list[tuple[int, ...]]  # the same object while the pair is unchanged
    index: dict[int, int]  # known port -> candidate index (ports on down paths absent)


class Model:
    """`build` for a caller that builds again and again (the aggregator): an endpoint pair's
    candidates are recomputed only when its known ports changed (PathMap.version), one of
    them expired, or a link on them went down or came back; an unchanged pair hands the
    solver the same candidate list object, whose split the engine keeps."""

    def __init__(self, topo: Topology, suspect_factor: float = 0.5,
                 arcs: Arcs | None = None) -> None:
        self.topo = topo
        self.suspect_factor = suspect_factor
        self.arcs = arcs or Arcs(topo)
        self.pairs: dict[tuple[str, str, str], _Pair] = {}
        self.pathmap: PathMap | None = None
        self.mark = (0, 0)  # the path map's log position at the last build
        self.down: set[str] = set()  # the down links at the last build
        self.until = float("inf")  # the earliest expiry of a kept pair
        self.cap: tuple[frozenset[str], np.ndarray] | None = None

    def _pair(self, key: tuple[str, str, str], pathmap: PathMap, down: set[str],
              now: float) -> _Pair:
        known = pathmap.ports(*key, now)
        links = frozenset(lk for p in known.values() for lk in p)
        by_path: dict[tuple[str, ...], list[int]] = {}
        for port, path in known.items():
            if not down.intersection(path):
                by_path.setdefault(path, []).append(port)
        paths = sorted(by_path)
        at = {p: k for k, p in enumerate(paths)}
        pr = _Pair(pathmap.fresh_until(key), known, links, paths,
                   [sorted(by_path[p]) for p in paths], [self.arcs.of_path(p) for p in paths],
                   {port: at[path] for port, path in known.items() if path in at})
        self.pairs[key] = pr
        self.until = min(self.until, pr.until)
        return pr

    def _pairs(self, keys: Iterable[tuple[str, str, str]], pathmap: PathMap, health: Health,
               now: float) -> dict[tuple[str, str, str], _Pair]:
        """The pair of each key: kept unless the path map changed it, an entry of it expired,
        or a link on one of its known paths went down or came back."""
        if pathmap is not self.pathmap:
            self.pairs.clear()
            self.pathmap = pathmap
            self.mark = pathmap.mark()
        dirty = pathmap.changed_since(self.mark)
        self.mark = pathmap.mark()
        flipped = health.down ^ self.down
        self.down = set(health.down)
        expired = now > self.until
        if expired:
            self.until = float("inf")
        out = {}
        pairs, down = self.pairs, health.down
        for key in keys:
            pr = pairs.get(key)
            if pr is None or dirty is None or key in dirty or \
                    (flipped and not flipped.isdisjoint(pr.links)) or (expired and now > pr.until):
                pr = self._pair(key, pathmap, down, now)
            elif expired:
                self.until = min(self.until, pr.until)
            out[key] = pr
        for key in [k for k in pairs if k not in out]:
            del pairs[key]  # pairs without flows: their memory goes with them
        return out

    def build(self, flows: list[Flow], pathmap: PathMap, health: Health, now: float) -> Built:
        """Candidates of each flow: the paths its known ports take, minus any through a down
        link. A suspect link keeps only `suspect_factor` of its capacity, so load leaves it
        first."""
        arcs = self.arcs
        base = np.zeros(2 * len(arcs.ids))
        unplanned: list[tuple[Flow, str]] = []
        floor = MICE * max((fl.demand for fl in flows), default=0.0)
        keys = [fl.key for fl in flows]
        # flows between the same endpoints (channels, QPs) share one pair
        seen = self._pairs(dict.fromkeys(keys), pathmap, health, now)
        prs = list(map(seen.__getitem__, keys))
        demand = np.fromiter((fl.demand for fl in flows), np.float64, len(flows))
        planned, mine = flows, prs
        if not (all(pr.paths for pr in seen.values()) and bool(np.all(demand >= floor))):
            planned, mine = [], []
            for fl, pr in zip(flows, prs):
                if fl.demand < floor:
                    # the acks of a one-way stream (the accepting end of a lab or NCCL socket
                    # connection, whose port is the listener's): moving it cannot lower the
                    # maximum
                    unplanned.append((fl, "too small to move"))
                    _base_load(self.topo, arcs, base, fl, pathmap.lookup(
                        fl.src, fl.dst, fl.pclass, fl.sport, now) if fl.sport is not None
                        else None)
                elif not pr.paths:
                    unplanned.append((fl, "no known port avoids the down links" if pr.known
                                      else "no path known yet"))
                    _base_load(self.topo, arcs, base, fl,
                               pr.known.get(fl.sport) if fl.sport is not None else None)
                else:
                    planned.append(fl)
                    mine.append(pr)
        cand_paths = [pr.paths for pr in mine]
        cand_ports = [pr.ports for pr in mine]
        cand_arcs = [pr.arcs for pr in mine]
        current = [pr.index.get(fl.sport, -1) for fl, pr in zip(planned, mine)]  # type: ignore[arg-type]
        inst = None
        if planned:
            suspect = frozenset(health.suspect)
            if self.cap is None or self.cap[0] != suspect:
                self.cap = (suspect, arcs.caps(health.suspect, self.suspect_factor))
            if planned is not flows:
                demand = np.fromiter((fl.demand for fl in planned), np.float64, len(planned))
            inst = Instance(self.cap[1], demand, cand_arcs, base)
        planned = list(planned)
        return Built(inst, planned, cand_paths, cand_ports, current, unplanned, arcs.names())


def build(topo: Topology, flows: list[Flow], pathmap: PathMap, health: Health, now: float,
          suspect_factor: float = 0.5, arcs: Arcs | None = None) -> Built:
    """One build (Model.build) for callers that plan once."""
    return Model(topo, suspect_factor, arcs).build(flows, pathmap, health, now)


def _base_load(topo: Topology, arcs: Arcs, base: np.ndarray, fl: Flow,
               cur_path: tuple[str, ...] | None) -> None:
    """An unplanned flow's load: on its path when known, else on the links every possible
    path of it shares (its access links)."""
    if cur_path is not None:
        for a in arcs.of_path(cur_path):
            base[a] += fl.demand
        return
    options = topo.candidate_paths(fl.src, fl.dst)
    if options:
        common = set(options[0]).intersection(*options[1:])
        for a in arcs.of_path(options[0]):
            if arcs.ids[a // 2] in common:
                base[a] += fl.demand


def choose_ports(b: Built, assign: list[int]) -> list[int]:
    """A source port per planned flow: its current port when its path stays, else a known port
    of the chosen path; TCP connections between the same endpoints never share a port."""
    used: dict[tuple[str, str, int], set[int]] = {}
    for f, fl in enumerate(b.flows):
        if fl.proto == "tcp" and assign[f] == b.current[f] and fl.sport is not None:
            used.setdefault((fl.src, fl.dst, fl.dport), set()).add(fl.sport)
    rr: dict[tuple[str, str, tuple[str, ...]], int] = {}
    out = []
    for f, fl in enumerate(b.flows):
        k = assign[f]
        ports = b.ports[f][k]
        if k == b.current[f] and fl.sport is not None:
            out.append(fl.sport)
            continue
        key = (fl.src, fl.dst, b.paths[f][k])
        start = rr.get(key, 0)
        taken = used.setdefault((fl.src, fl.dst, fl.dport), set()) if fl.proto == "tcp" else set()
        pick = ports[start % len(ports)]
        for i in range(len(ports)):
            p = ports[(start + i) % len(ports)]
            if p not in taken:
                pick = p
                break
        rr[key] = start + 1
        taken.add(pick)
        out.append(pick)
    return out

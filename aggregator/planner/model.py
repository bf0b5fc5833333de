"""From what the aggregator knows (topology, flows, path map, link health) to a solver
`Instance`, and from the solver's choice back to a source port per flow."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Collection, Hashable, Iterable, Mapping

import numpy as np

from c4.core.topology import Topology

from .pathmap import Path, PathMap
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

    # (src, dst, path class): the path map's key; flows are never changed in place
    key: tuple[str, str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = (self.src, self.dst, path_class(self.proto, self.dport))

    @property
    def pclass(self) -> str:
        return self.key[2]


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
    paths: list[tuple[Path, ...]]  # per planned flow: candidate paths (link ids)
    ports: list[tuple[tuple[int, ...], ...]]  # per planned flow, per candidate: known ports
    current: list[int]  # per planned flow: candidate index of its current port, -1 unknown
    unplanned: list[tuple[Flow, str]]  # flows left alone, with the reason
    arcs: list[tuple[str, bool]]  # arc index -> (link id, forward)
    keys: list[Hashable] = field(default_factory=list)  # per planned flow: the caller's key


class Arcs:
    """Directed links: index 2i is link i traversed a -> b, 2i+1 the other way."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.ids = list(topo.links)
        self.index = {lid: i for i, lid in enumerate(self.ids)}
        self.ends = {lid: (2 * i, lk.a, lk.b) for i, (lid, lk) in enumerate(topo.links.items())}
        self.gbps = np.repeat([topo.links[lid].gbps * 1e9 / 8 for lid in self.ids], 2)
        self.named = [(lid, d == 0) for lid in self.ids for d in (0, 1)]
        nodes: dict[str, int] = {}
        self.a = np.array([nodes.setdefault(lk.a, len(nodes)) for lk in topo.links.values()],
                          dtype=np.intp)
        self.b = np.array([nodes.setdefault(lk.b, len(nodes)) for lk in topo.links.values()],
                          dtype=np.intp)

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

    def of_paths(self, paths: list[tuple[str, ...]]) -> list[tuple[int, ...]]:
        """`of_path` of each path, vectorised over all of them (a first build turns
        100,000 paths into arcs)."""
        if not paths:
            return []
        lens = np.fromiter(map(len, paths), dtype=np.intp, count=len(paths))
        links = np.fromiter(map(self.index.__getitem__, chain.from_iterable(paths)),
                            dtype=np.intp, count=int(lens.sum()))
        ends = np.cumsum(lens)
        starts = ends - lens
        pos = np.arange(len(links)) - np.repeat(starts, lens)
        a, b = self.a[links], self.b[links]
        fwd = np.ones(len(links), dtype=bool)
        reached = b.copy()  # the node each link leads to, in the path's direction
        for j in range(1, int(lens.max())):
            at = np.flatnonzero(pos == j)
            prev = reached[at - 1]
            f = a[at] == prev
            bad = ~f & (b[at] != prev)
            if bad.any():
                i = int(at[np.argmax(bad)])
                p = int(np.searchsorted(ends, i, side="right"))
                raise ValueError(f"path {paths[p]}: {paths[p][i - starts[p]]} does not "
                                 "continue it")
            fwd[at] = f
            reached[at] = np.where(f, b[at], a[at])
        flat = (2 * links + ~fwd).tolist()
        return [tuple(flat[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]

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


PairKey = tuple[str, str, str]  # (src, dst, path class)


@dataclass(slots=True)
class _Pair:
    """What one (src, dst, proto) contributes: its known ports and candidate paths. Tuples
    where it can: the garbage collector stops scanning them (16,384 pairs at 16,384 GPUs)."""

    until: float  # when its oldest entry expires
    known: bool  # any port known (usable or not)
    paths: tuple[Path, ...]  # usable (no down link), sorted
    ports: tuple[tuple[int, ...], ...]  # the path map's own tuples
    arcs: list[tuple[int, ...]]  # the same object while the pair is unchanged


class Model:
    """`build` for a caller that builds again and again (the aggregator). Kept between builds:

    - each endpoint pair's candidates, recomputed only when its known ports changed (the
      path map's change log), one of them expired, or a link on one of its known paths went
      down or came back (pairs are indexed by link, so a link failure touches only the pairs
      with a known path over it); an unchanged pair hands the solver the same candidate list
      object, whose split the engine keeps;
    - the solver input itself: per planned flow its position, candidates, current candidate
      and demand. A build re-evaluates only the flows the caller names as `changed` (or, when
      it names none, the flows whose `Flow` object differs from the last build's) and the
      flows of the pairs that changed, so its cost follows what changed, not how many flows
      there are. A flow keeps its position while it stays planned; one that leaves is
      replaced by the last (the engine updates the positions that changed)."""

    def __init__(self, topo: Topology, suspect_factor: float = 0.5,
                 arcs: Arcs | None = None) -> None:
        self.topo = topo
        self.suspect_factor = suspect_factor
        self.arcs = arcs or Arcs(topo)
        self.pathmap: PathMap | None = None
        self.now = 0.0  # the time of the build under way
        self.cap: tuple[frozenset[str], np.ndarray] | None = None
        self._reset()

    def _reset(self) -> None:
        self.pairs: dict[PairKey, _Pair] = {}
        self.members: dict[PairKey, dict[Hashable, None]] = {}  # pair -> its flows (ordered)
        self.seen: dict[Hashable, Flow] = {}  # every flow of the last build
        self.mark = (0, 0)  # the path map's log position at the last build
        self.down: set[str] = set()  # the down links at the last build
        self.until = float("inf")  # the earliest expiry of a kept pair
        self.floor = 0.0
        # the planned flows, by position
        self.at: dict[Hashable, int] = {}
        self.keys: list[Hashable] = []
        self.flows: list[Flow] = []
        self.cand: list[list[tuple[int, ...]]] = []  # candidate paths as arcs (the pair's)
        self.paths: list[tuple[Path, ...]] = []
        self.ports: list[tuple[tuple[int, ...], ...]] = []
        self.current: list[int] = []
        self.dem: list[float] = []
        self.off: dict[Hashable, tuple[Flow, str]] = {}  # unplanned flows, with the reason

    def _pairs(self, keys: Iterable[PairKey], pathmap: PathMap, down: set[str],
               now: float) -> None:
        """Compute the candidates of `keys` again (the path map keeps each key's ports
        grouped by path; every path's arcs in one vectorised pass)."""
        todo: list[_Pair] = []
        for key in keys:
            groups, until = pathmap.by_path(key, now)
            paths = tuple(p for p in groups if down.isdisjoint(p)) if down else tuple(groups)
            pr = _Pair(until, bool(groups), paths,
                       tuple(map(groups.__getitem__, paths)), [])
            self.pairs[key] = pr
            if pr.until < self.until:
                self.until = pr.until
            todo.append(pr)
        arcs = self.arcs.of_paths([p for pr in todo for p in pr.paths])
        i = 0
        for pr in todo:
            pr.arcs = arcs[i:i + len(pr.paths)]
            i += len(pr.paths)

    def build(self, flows: Mapping[Any, Flow] | list[Flow], pathmap: PathMap,
              health: Health, now: float, changed: Collection[Hashable] | None = None) -> Built:
        """Candidates of each flow: the paths its known ports take, minus any through a down
        link. A suspect link keeps only `suspect_factor` of its capacity, so load leaves it
        first. `flows`: by the caller's key (a list: by flow id); `changed`: the keys whose
        flow was added, replaced or removed since the last build (None: compared here)."""
        if not isinstance(flows, Mapping):
            flows = {fl.id: fl for fl in flows}
        self.now = now
        if pathmap is not self.pathmap:
            self._reset()
            self.pathmap = pathmap
            self.mark = pathmap.mark()
            changed = None
        seen = self.seen
        if changed is None:
            todo = dict.fromkeys(k for k, fl in flows.items() if seen.get(k) is not fl)
            todo.update(dict.fromkeys(k for k in seen if k not in flows))
        else:
            todo = dict.fromkeys(changed)
        # which flows belong to which pair
        fresh: set[PairKey] = set()
        for k in todo:
            old, fl = seen.get(k), flows.get(k)
            if old is not None and (fl is None or old.key != fl.key):
                mates = self.members[old.key]
                del mates[k]
                if not mates:
                    del self.members[old.key]
                    self.pairs.pop(old.key, None)
            if fl is None:
                seen.pop(k, None)
                continue
            seen[k] = fl
            self.members.setdefault(fl.key, {})[k] = None
            if fl.key not in self.pairs:
                fresh.add(fl.key)
        # the pairs to compute again: new, changed in the path map, over a link that went
        # down or came back, expired
        dirty = pathmap.changed_since(self.mark)
        self.mark = pathmap.mark()
        redo = set(self.pairs) if dirty is None else dirty.intersection(self.pairs)
        redo |= fresh
        # the path map indexes its entries by link: a pair with no entry over the link has
        # no path over it (an entry forgotten since is in the change log)
        for lk in health.down ^ self.down:
            redo.update(key for key, _ in pathmap.by_link.get(lk, ()) if key in self.pairs)
        self.down = set(health.down)
        if now > self.until:
            self.until = float("inf")
            for key, pr in self.pairs.items():
                if now > pr.until:
                    redo.add(key)
                else:
                    self.until = min(self.until, pr.until)
        keys = sorted(redo)
        self._pairs(keys, pathmap, health.down, now)
        for key in keys:
            todo.update(self.members[key])
        # flows below MICE of the largest are left alone: the floor comes from every flow's
        # new demand
        dem = np.asarray(self.dem)
        mine = [self.at[k] for k in todo if k in self.at]
        if mine:
            dem[mine] = 0.0
        top = max(float(dem.max(initial=0.0)),
                  max((flows[k].demand for k in todo if k in flows), default=0.0),
                  max((fl.demand for k, (fl, _) in self.off.items() if k not in todo),
                      default=0.0))
        floor = MICE * top
        if floor != self.floor:
            self.floor = floor
            todo.update(dict.fromkeys(self.keys[i] for i in np.flatnonzero(dem < floor)))
            todo.update(dict.fromkeys(self.off))
        for k in todo:
            self._place(k, flows.get(k), floor)
        return self._built(pathmap, health, now)

    def _place(self, k: Hashable, fl: Flow | None, floor: float) -> None:
        """Flow `k` planned (at its position, or appended) or left alone, from its pair."""
        pos = self.at.get(k)
        why = None
        if fl is not None:
            pr = self.pairs[fl.key]
            if fl.meta.get("accepted"):
                # its port is the listener's (gloo carries data both ways on a connection
                # the other end made): an assignment could only fail
                why = "accepting end: the connecting end's port picks the path"
            elif fl.demand < floor:
                # e.g. the acks of a one-way stream's receiver: moving it cannot lower the
                # maximum
                why = "too small to move"
            elif not pr.paths:
                why = "no known port avoids the down links" if pr.known else "no path known yet"
        if fl is None or why is not None:
            if pos is not None:
                self._remove(pos)
            if fl is None:
                self.off.pop(k, None)
            else:
                self.off[k] = (fl, why or "")
            return
        if self.off:
            self.off.pop(k, None)
        # the candidate its own port takes: the pair holds the fresh ports of each usable
        # path (what `_path` and an index into `paths` find, without the path map)
        sport = fl.sport
        cur = -1
        if sport is not None:
            for i, ports in enumerate(pr.ports):
                if sport in ports:
                    cur = i
                    break
        if pos is None:
            self.at[k] = len(self.keys)
            self.keys.append(k)
            self.flows.append(fl)
            self.cand.append(pr.arcs)
            self.paths.append(pr.paths)
            self.ports.append(pr.ports)
            self.current.append(cur)
            self.dem.append(fl.demand)
        else:
            self.flows[pos], self.current[pos], self.dem[pos] = fl, cur, fl.demand
            self.cand[pos], self.paths[pos], self.ports[pos] = pr.arcs, pr.paths, pr.ports

    def _path(self, fl: Flow) -> tuple[str, ...] | None:
        """The path the flow's own port takes, as the path map knows it at this build."""
        if fl.sport is None or self.pathmap is None:
            return None
        return self.pathmap.path(fl.key, fl.sport, self.now)

    def _remove(self, pos: int) -> None:
        last = len(self.keys) - 1
        del self.at[self.keys[pos]]
        cols: tuple[list[Any], ...] = (self.keys, self.flows, self.cand, self.paths,
                                       self.ports, self.current, self.dem)
        for col in cols:
            col[pos] = col[last]
            col.pop()
        if pos < last:
            self.at[self.keys[pos]] = pos

    def _built(self, pathmap: PathMap, health: Health, now: float) -> Built:
        arcs = self.arcs
        base = np.zeros(2 * len(arcs.ids))
        for fl, _ in self.off.values():
            _base_load(self.topo, arcs, base, fl, self._path(fl))
        inst = None
        if self.flows:
            suspect = frozenset(health.suspect)
            if self.cap is None or self.cap[0] != suspect:
                self.cap = (suspect, arcs.caps(health.suspect, self.suspect_factor))
            inst = Instance(self.cap[1], np.asarray(self.dem), list(self.cand), base)
        return Built(inst, list(self.flows), list(self.paths), list(self.ports),
                     list(self.current),
                     list(self.off.values()), arcs.names(), list(self.keys))


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


def choose_ports(b: Built, assign: list[int],
                 flows: Iterable[int] | None = None) -> dict[int, int]:
    """A source port for each of `flows` (default: every planned flow; a re-plan names the
    moved ones): its current port when its path stays, else a known port of the chosen path;
    TCP connections between the same endpoints never share a port."""
    todo = range(len(b.flows)) if flows is None else sorted(flows)
    used: dict[tuple[str, str, int], set[int]] = {}
    if any(b.flows[f].proto == "tcp" for f in todo):
        for f, fl in enumerate(b.flows):
            if fl.proto == "tcp" and assign[f] == b.current[f] and fl.sport is not None:
                used.setdefault((fl.src, fl.dst, fl.dport), set()).add(fl.sport)
    rr: dict[tuple[str, str, tuple[str, ...]], int] = {}
    out = {}
    for f in todo:
        fl = b.flows[f]
        k = assign[f]
        ports = b.ports[f][k]
        if k == b.current[f] and fl.sport is not None:
            out[f] = fl.sport
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
        out[f] = pick
    return out

"""The C4P optimisation: give every flow one of its known paths so that the most utilised
directed link (load / capacity) is as low as possible, moving as few flows as possible.

Pure arithmetic on indices: the caller (service.py) turns topology, path map and flows into an
`Instance` and the chosen path indices back into source ports.

- `Engine.plan`: largest-first greedy, then local improvement (moves and ejection chains off
  the bottleneck links), then, while the budget lasts, large-neighbourhood search: the flows
  on the busiest links and their neighbours are re-placed optimally by a small MILP (HiGHS)
  with every other flow fixed. The same is run from the flows' current paths and the better
  result wins (fewer moves on a tie), so a plan is never worse than leaving the flows where
  ECMP put them.
- `Engine.replan`: keeps every flow whose path is still usable, puts each displaced flow on
  its best alternative (largest first), relieves what that overloads with moves of displaced
  flows first; then, from the flows' paths again, inserts the displaced flows where the fewest
  others must move to stay at that maximum (in several orders while time is left); undoes
  every move the final maximum does not need (single returns, pairs of moved flows back for
  one other move, a MILP over the moved flows and those in the way of their returns), and,
  with time left, asks a MILP over their neighbourhood for the fewest moves that reach the
  same maximum.
- The engine keeps, between plans, the split of each candidate list into the arcs all its
  paths share and the arcs they differ on (model.Model hands an unchanged endpoint pair the
  same list object), so a re-plan sets up its state with array operations only.
- `lp_bound` / `milp_optimum` / `min_moves` (benchmark and tests): the LP relaxation over the
  same candidate paths is the lower bound no plan can beat; the MILP is the integral optimum;
  `min_moves` the fewest moves any assignment reaching a given maximum needs.
"""
from __future__ import annotations

import ctypes
import functools
import gc
import math
import operator
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Iterator, NamedTuple, ParamSpec, Sequence, TypeVar

import highspy
import numpy as np



def _quiet_highs() -> None:
    """HiGHS writes its banner to file descriptor 1 when the process makes its first `Highs`,
    before any option (output_flag) can be set: make that first one here, at import (before
    the aggregator starts its threads), with descriptor 1 on /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()  # type: ignore[no-untyped-call]  # highspy 1.16: __init__ unannotated
            ctypes.CDLL(None).fflush(None)  # C stdio may hold it when stdout is no terminal
    finally:
        os.dup2(saved, 1)
        os.close(saved)


_quiet_highs()

EPS = 1e-9
CHUNK = 128  # flows scored per array step in the greedy
HOOD = 1500  # flows one large-neighbourhood MILP may re-place
MOVERS = 3000  # flows the MILP for the fewest moves takes without a neighbourhood
RESTARTS = 0.5  # of a plan's budget: the greedy in other orders (`Engine._restarts`)
WHOLE = 4096  # flows up to which a plan asks HiGHS for a placement at the whole-flow bound
TAIL = 0.015  # seconds a re-plan keeps after its MILP for taking the answer over
BACK = 0.012  # seconds a re-plan keeps for the MILP over its moved flows
CHECKED = 200  # flows up to which min_moves solves again without HiGHS's presolve
TRIES = 8  # shuffled orders a re-plan may insert its displaced flows in, time permitting
SWAP = 0.1  # share of a re-plan's budget for swaps (two moved flows back for one new move)
PAIRS = 20000  # pairs of moved flows sharing an arc up to which swaps try those first
BULK = 1000  # moved flows from which restore returns them in array steps
SETUP = 6e-6  # seconds setting up a MILP takes per candidate path of its free flows (loaded VM)


@dataclass
class Instance:
    """cap: capacity per directed link (arc); demand per flow; cand[f]: the distinct paths flow
    f may take, each a tuple of arc indices; base: load already on each arc from traffic the
    plan does not place (flows with unknown paths). Flows between the same endpoints should
    share one candidate list object: the engine splits each list once."""

    cap: np.ndarray
    demand: np.ndarray
    cand: list[list[tuple[int, ...]]]
    base: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        self.cap = np.asarray(self.cap, dtype=np.float64)
        self.demand = np.asarray(self.demand, dtype=np.float64)
        self.base = (np.zeros(len(self.cap)) if len(self.base) == 0
                     else np.asarray(self.base, dtype=np.float64))
        if len(self.cand) != len(self.demand):
            raise ValueError("one candidate list per flow")
        if not all(self.cand):
            raise ValueError("every flow needs at least one candidate path")

    @property
    def flows(self) -> int:
        return len(self.demand)


@dataclass
class Result:
    assign: list[int]  # per flow: index into cand[f]
    max_util: float
    moved: list[int] = field(default_factory=list)  # flows whose path differs from `prev`
    seconds: float = 0.0


def arc_sums(inst: Instance, assign: Sequence[int], *per_flow: np.ndarray) -> list[np.ndarray]:
    """Per arc, the sum of each per-flow array over the flows whose assigned path crosses it
    (the paths gathered once for all of them)."""
    paths = [c[k] for c, k in zip(inst.cand, assign)]
    lens = np.fromiter(map(len, paths), dtype=np.intp, count=len(paths))
    flat = np.fromiter(chain.from_iterable(paths), dtype=np.intp, count=int(lens.sum()))
    return [np.bincount(flat, weights=np.repeat(x, lens), minlength=len(inst.cap))
            for x in per_flow]


def loads(inst: Instance, assign: Sequence[int]) -> np.ndarray:
    out: np.ndarray = inst.base + arc_sums(inst, assign, inst.demand)[0]
    return out


def max_util(inst: Instance, assign: Sequence[int]) -> float:
    return float(np.max(loads(inst, assign) / inst.cap)) if len(inst.cap) else 0.0


Split = tuple[tuple[int, ...], list[tuple[int, ...]]]


def _split(paths: list[tuple[int, ...]]) -> Split:
    """The arcs every path of a candidate list shares (their load is fixed) and, per path,
    the arcs it varies on."""
    p0 = paths[0]
    common = set(p0).intersection(*paths[1:]) if len(paths) > 1 else set(p0)
    if len(common) == 2 and p0[0] in common and p0[-1] in common and \
            all(p[0] == p0[0] and p[-1] == p0[-1] for p in paths):
        return (p0[0], p0[-1]), [p[1:-1] for p in paths]  # the usual case: shared NIC links
    return tuple(common), [tuple(a for a in p if a not in common) for p in paths]


def _split_all(lists: list[list[tuple[int, ...]]]) -> list[Split]:
    """`_split` of each list; the usual case (every path of a list as long, sharing its
    first and last arc and no other) in array steps per shape: a first plan at 32,768
    flows splits 16,384 lists."""
    out: list[Split | None] = [None] * len(lists)
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, c in enumerate(lists):
        n = len(c[0])
        if len(c) > 1 and n > 2 and all(len(p) == n for p in c):
            shapes.setdefault((len(c), n), []).append(i)
    for (k, n), members in shapes.items():
        A = np.fromiter(chain.from_iterable(chain.from_iterable(lists[i] for i in members)),
                        dtype=np.intp, count=len(members) * k * n).reshape(len(members), k, n)
        ok = (A[:, :, 0] == A[:, :1, 0]).all(axis=1) & (A[:, :, -1] == A[:, :1, -1]).all(axis=1)
        mid = A[:, :, 1:-1]
        for j in range(n - 2):  # an arc of the first path's middle in every path: shared
            ok &= ~(mid == mid[:, :1, j:j + 1]).any(axis=2).all(axis=1)
        for i, a, z in zip(np.asarray(members)[ok].tolist(), A[ok, 0, 0].tolist(),
                           A[ok, 0, -1].tolist()):
            out[i] = ((a, z), [p[1:-1] for p in lists[i]])
    return [got if got is not None else _split(c) for got, c in zip(out, lists)]


class _On(dict[int, set[int]]):
    """Arc -> the flows on it. After one bulk placement the sets are made on first use from
    sorted arrays, so a state for 30,000 flows costs no Python loop over them."""

    def __init__(self) -> None:
        super().__init__()
        self.flows: list[int] | None = None
        self.starts: list[int] = [0]

    def bulk(self, arcs: np.ndarray, owners: np.ndarray, n_arcs: int) -> None:
        order = np.argsort(arcs, kind="stable")
        # Python lists: a set made from a list slice costs a fraction of one from an array
        # slice, and a plan at 32,768 flows makes ~15,000 of them
        self.flows = owners[order].tolist()
        self.starts = np.searchsorted(arcs[order], np.arange(n_arcs + 1)).tolist()

    def __missing__(self, a: int) -> set[int]:
        s = set() if self.flows is None else set(self.flows[self.starts[a]:self.starts[a + 1]])
        self[a] = s
        return s


class _State:
    """Assignment + per-arc loads over the arcs that differ between a flow's candidates (the
    arcs every candidate shares are constant and folded into the fixed load)."""

    def __init__(self, inst: Instance, com: list[tuple[int, ...]],
                 var: list[list[tuple[int, ...]]]) -> None:
        self.inst = inst
        n_arcs = len(inst.cap)
        self.inv = (1.0 / inst.cap).tolist()
        self.d = inst.demand.tolist()
        self.var = var
        lens = np.fromiter(map(len, com), dtype=np.intp, count=len(com))
        flat = np.fromiter(chain.from_iterable(com), dtype=np.intp, count=int(lens.sum()))
        self.com = com
        self.fixed = inst.base + np.bincount(flat, weights=np.repeat(inst.demand, lens),
                                             minlength=n_arcs)
        self.fixed_util = float(np.max(self.fixed / inst.cap)) if n_arcs else 0.0
        self.load = self.fixed.tolist()
        # `load` as an array, kept up to date at the arcs moves touched since (`dirty`):
        # a re-plan asks for the utilisation again and again, over 60,000 arcs at 16,384 GPUs
        self.arr: np.ndarray | None = None
        self.dirty: set[int] = set()
        self.assign = [-1] * inst.flows
        self.on = _On()
        self.touched: set[int] = set()  # flows placed or lifted since the state was set up
        self.budget = 0
        self.stop = float("inf")  # improve's or insert's deadline: the ejection chains stop at it
        self.frugal = False  # insert's chains try one harmless move first (`_direct`)
        # moves of flows outside `free` an ejection chain has made and may make (swap's)
        self.spent, self.allow = 0, sys.maxsize

    def place(self, f: int, k: int) -> None:
        d = self.d[f]
        for a in self.var[f][k]:
            self.load[a] += d
            self.on[a].add(f)
        self.dirty.update(self.var[f][k])
        self.assign[f] = k
        self.touched.add(f)

    def lift(self, f: int) -> None:
        k = self.assign[f]
        d = self.d[f]
        for a in self.var[f][k]:
            self.load[a] -= d
            self.on[a].discard(f)
        self.dirty.update(self.var[f][k])
        self.assign[f] = -1
        self.touched.add(f)

    def place_all(self, assign: Sequence[int]) -> None:
        """Place every flow with `assign[f] >= 0` at once (a fresh state only)."""
        keep = [f for f, k in enumerate(assign) if k >= 0]
        for f in keep:
            self.assign[f] = assign[f]
        load = np.asarray(self.load)
        self.load = self._add(keep, load).tolist()
        self.arr = None
        self._index(keep)

    def _add(self, flows: Sequence[int], load: np.ndarray) -> np.ndarray:
        paths = [self.var[f][self.assign[f]] for f in flows]
        lens = np.fromiter(map(len, paths), dtype=np.intp, count=len(paths))
        flat = np.fromiter(chain.from_iterable(paths), dtype=np.intp, count=int(lens.sum()))
        d = np.asarray(self.d)[np.asarray(flows, dtype=np.intp)] if flows else np.zeros(0)
        return load + np.bincount(flat, weights=np.repeat(d, lens), minlength=len(load))

    def _index(self, flows: Sequence[int]) -> None:
        if self.on.flows is None and not self.on and len(flows) > 64:
            paths = [self.var[f][self.assign[f]] for f in flows]
            lens = np.fromiter(map(len, paths), dtype=np.intp, count=len(paths))
            flat = np.fromiter(chain.from_iterable(paths), dtype=np.intp, count=int(lens.sum()))
            self.on.bulk(flat, np.repeat(np.asarray(flows, dtype=np.intp), lens), len(self.inv))
            return
        for f in flows:
            for a in self.var[f][self.assign[f]]:
                self.on[a].add(f)

    def util(self) -> np.ndarray:
        u: np.ndarray = self.loads() / self.inst.cap
        return u

    def loads(self) -> np.ndarray:
        """`load` as an array (shared: callers copy before changing it)."""
        if self.arr is None:
            self.arr = np.asarray(self.load)
        elif self.dirty:
            idx = list(self.dirty)
            self.arr[idx] = [self.load[a] for a in idx]
        self.dirty = set()
        return self.arr

    def max_util(self) -> float:
        return max(float(np.max(self.util(), initial=0.0)), self.fixed_util)

    def hot(self, u: np.ndarray, limit: float) -> list[int]:
        """Arcs at or above `limit`, busiest first."""
        at = np.flatnonzero(u >= limit)
        out: list[int] = at[np.argsort(-u[at], kind="stable")].tolist()
        return out

    def moved(self, prev: Sequence[int] | None) -> list[int]:
        if prev is None:
            return list(range(len(self.assign)))
        return sorted(f for f in self.touched if prev[f] != self.assign[f])

    def greedy(self, flows: Sequence[int], prefer: Sequence[int] | None = None) -> None:
        """Place `flows` largest first, each on the candidate whose busiest arc ends lowest
        (then the lowest total), keeping `prefer[f]` on a tie.

        Vectorised without changing the result of some largest-first order: flows of about
        the same demand (within 5%: the order among them is a tie-break anyway) are split
        into rounds of flows that share no arc, and a round is scored in one array step."""
        pad = len(self.inv)
        bad = pad + 1  # fills missing candidates: infinitely loaded
        load = np.concatenate([self.loads(), [0.0, np.inf]])
        inv = np.asarray(self.inv + [0.0, 1.0])
        todo = [f for f in flows if len(self.var[f]) > 1]
        for f in flows:
            if len(self.var[f]) == 1:
                self.assign[f] = 0
                for a in self.var[f][0]:
                    load[a] += self.d[f]
        # one padded (candidates x arcs) block per flow, built per candidate list (flows
        # between the same endpoints share one) and per shape at C speed
        lists: dict[int, list[int]] = {}
        for i, f in enumerate(todo):
            lists.setdefault(id(self.var[f]), []).append(i)
        shapes: dict[tuple[int, int, bool], list[list[int]]] = {}
        for members in lists.values():
            lens = {len(p) for p in self.var[todo[members[0]]]}
            key = (len(self.var[todo[members[0]]]), max(lens), len(lens) == 1)
            shapes.setdefault(key, []).append(members)
        kmax = max((k for k, _, _ in shapes), default=1)
        lmax = max((w for _, w, _ in shapes), default=1) or 1
        P = np.full((len(todo), kmax, lmax), pad, dtype=np.intp)
        for (ncand, width, even), groups in shapes.items():
            var = [self.var[todo[m[0]]] for m in groups]
            if even:
                flat = np.fromiter(chain.from_iterable(chain.from_iterable(var)), dtype=np.intp,
                                   count=len(var) * ncand * width)
            else:
                flat = np.fromiter(chain.from_iterable(
                    p + (pad,) * (width - len(p)) for v in var for p in v), dtype=np.intp,
                    count=len(var) * ncand * width)
            block = flat.reshape(len(var), ncand, width)
            sizes = np.fromiter(map(len, groups), dtype=np.intp, count=len(groups))
            rows = np.fromiter(chain.from_iterable(groups), dtype=np.intp, count=int(sizes.sum()))
            P[rows, :ncand, :width] = np.repeat(block, sizes, axis=0)
            P[rows, ncand:, 0] = bad
        D = np.array([self.d[f] for f in todo])
        pref = np.array([prefer[f] if prefer is not None else -1 for f in todo], dtype=np.intp)
        # largest first; flows within 5% of each other form one bucket, shuffled by a fixed
        # hash so that neighbours (same leaf) rarely meet in one chunk
        bucket = np.floor(np.log(np.maximum(D, 1e-300)) / np.log(1.05)).astype(np.int64)
        order = np.lexsort(((np.arange(len(todo)) * 2654435761) % 4294967291, -bucket))
        starts = np.flatnonzero(np.r_[True, bucket[order][1:] != bucket[order][:-1]])
        for lo, hi in zip(starts, np.r_[starts[1:], len(order)]):
            queue = order[lo:hi]
            while len(queue):
                idx, queue = queue[:CHUNK], queue[CHUNK:]
                arr = P[idx]  # (n, K, L)
                u = (load[arr] + D[idx][:, None, None]) * inv[arr]
                score = u.max(axis=2) + 1e-6 * u.sum(axis=2)
                has = np.flatnonzero(pref[idx] >= 0)
                score[has, pref[idx][has]] -= 1e-12
                k = score.argmin(axis=1)
                chosen = arr[np.arange(len(idx)), k]  # (n, L)
                # Scoring a chunk against one load is exact for every flow whose chosen arcs
                # no earlier flow of the chunk chose: the others' commits only raise arcs it
                # did not pick. The rest go round again.
                flat = chosen.ravel()
                owner = np.repeat(np.arange(len(idx)), lmax)
                real = flat < pad
                flat, owner = flat[real], owner[real]
                uniq, first = np.unique(flat, return_index=True)
                first_owner = owner[first][np.searchsorted(uniq, flat)]
                dirty = np.zeros(len(idx), dtype=bool)
                dirty[owner[first_owner != owner]] = True
                ok = ~dirty
                np.add.at(load, chosen[ok].ravel(), np.repeat(D[idx][ok], lmax))
                for i, kk in zip(idx[ok].tolist(), k[ok].tolist()):
                    self.assign[todo[i]] = kk
                if dirty.any():
                    queue = np.concatenate([idx[dirty], queue])
        self.load = load[:pad].tolist()
        self.arr = None
        self._index(flows)
        self.touched.update(flows)

    # -- local improvement ------------------------------------------------------------------
    def _relieve(self, a: int, limit: float, free: set[int],
                 journal: list[tuple[int, int]], depth: int,
                 busy: set[int]) -> bool:
        """Bring arc `a` below `limit` by moving flows off it, never leaving another arc at or
        above `limit`: a move that overloads up to two arcs recursively relieves them (an
        ejection chain, `depth` deep, within the shared work `budget`). Moves of flows in
        `free` are tried first; flows in `busy` are already moving in this chain; at most
        `allow` moves of flows outside `free` (`spent` counts them)."""
        inv, load = self.inv, self.load
        while load[a] * inv[a] >= limit:
            if self.frugal and self._direct(a, limit, free, journal, busy):
                continue
            flows = sorted((f for f in self.on[a] if f not in busy),
                           key=lambda f: (f not in free, -self.d[f], f))
            moved = False
            for f in flows[:12] if depth < 2 else flows:
                if time.perf_counter() >= self.stop:
                    return False
                paid = f not in free
                if paid and self.spent >= self.allow:
                    break  # the flows of `free` came first
                cur = self.assign[f]
                d = self.d[f]
                mine = self.var[f][cur]
                tries = []
                for k, p in enumerate(self.var[f]):
                    if k == cur or a in p:
                        continue
                    self.budget -= 1
                    over = [b for b in p if b not in mine and (load[b] + d) * inv[b] >= limit]
                    if not over:
                        tries = [(0, k, over)]
                        break
                    if depth > 0 and len(over) <= 2:
                        tries.append((len(over), k, over))
                if not tries or self.budget < 0:
                    continue
                tries.sort(key=lambda t: t[0])
                for n_over, k, over in tries[:4]:
                    mark, spent = len(journal), self.spent
                    journal.append((f, cur))
                    self.spent += paid
                    self.lift(f)
                    self.place(f, k)
                    if n_over == 0:
                        moved = True
                        break
                    busy.add(f)
                    ok = all(self._relieve(b, limit, free, journal, depth - 1, busy)
                             for b in over)
                    busy.discard(f)
                    if ok:
                        moved = True
                        break
                    self._undo(journal, mark)
                    self.spent = spent
                if moved:
                    break
            if not moved:
                return False
        return True

    def _direct(self, a: int, limit: float, free: set[int], journal: list[tuple[int, int]],
                busy: set[int]) -> bool:
        """One move off arc `a` that overloads nothing: a flow of `free` first (it counts
        once), then the smallest flow that alone brings `a` below `limit` (the large ones
        are the hard ones to place), then the largest."""
        excess = self.load[a] - limit / self.inv[a]
        d = self.d
        flows = sorted((f for f in self.on[a] if f not in busy), key=lambda f: (
            f not in free, d[f] <= excess, d[f] if d[f] > excess else -d[f], f))
        inv, load = self.inv, self.load
        for f in flows:
            if f not in free and self.spent >= self.allow:
                break
            cur = self.assign[f]
            mine = self.var[f][cur]
            for k, p in enumerate(self.var[f]):
                if k == cur or a in p:
                    continue
                self.budget -= 1
                if all(b in mine or (load[b] + d[f]) * inv[b] < limit for b in p):
                    self.spent += f not in free
                    journal.append((f, cur))
                    self.lift(f)
                    self.place(f, k)
                    return True
        return False

    def _undo(self, journal: list[tuple[int, int]], mark: int) -> None:
        while len(journal) > mark:
            f, k = journal.pop()
            if self.assign[f] >= 0:
                self.lift(f)
            if k >= 0:
                self.place(f, k)

    def insert(self, flows: Sequence[int], level: float, deadline: float,
               direct: bool = False) -> bool:
        """Place each of `flows` (unplaced; in the order given) on the candidate that needs the
        fewest other flows moved to keep every arc at or below `level`: what the placement
        overloads is relieved by ejection chains that move `flows` and already moved flows
        first (they count once however often they move); `direct`: a link is first relieved
        by one move that overloads nothing (`_direct`). False when some flow fits nowhere
        at `level`; it then goes where its busiest arc ends lowest."""
        self.frugal, self.stop = direct, deadline
        try:
            return self._insert(flows, level, deadline)
        finally:
            self.frugal, self.stop = False, float("inf")

    def _insert(self, flows: Sequence[int], level: float, deadline: float) -> bool:
        free = set(flows)
        limit = level + max(EPS, level * 1e-9)
        ok = True
        inv, load = self.inv, self.load
        for f in flows:
            best: tuple[tuple[int, float], int] | None = None
            d = self.d[f]
            # a candidate that overloads nothing moves no one: the lowest such is the choice
            # (no chain search); else candidates that overload fewer arcs are tried first
            ranked = sorted((sum((load[a] + d) * inv[a] >= limit for a in p),
                             max(((load[a] + d) * inv[a] for a in p), default=0.0), k)
                            for k, p in enumerate(self.var[f]))
            if ranked[0][0] == 0:
                self.place(f, ranked[0][2])
                continue
            for _, _, k in ranked:
                if time.perf_counter() >= deadline:
                    break
                journal: list[tuple[int, int]] = []
                if self._fit(f, k, limit, free, journal):
                    cost = len({g for g, _ in journal if g not in free})
                    worst = max((self.load[a] * self.inv[a] for a in self.var[f][k]),
                                default=0.0)
                    if best is None or (cost, worst) < best[0]:
                        best = ((cost, worst), k)
                self._undo(journal, 0)
            if best is None:
                ok = False
                d = self.d[f]
                self.place(f, min(range(len(self.var[f])), key=lambda k: max(
                    ((self.load[a] + d) * self.inv[a] for a in self.var[f][k]), default=0.0)))
                continue
            journal = []
            self._fit(f, best[1], limit, free, journal)
            free.update(g for g, _ in journal)
        return ok

    def _fit(self, f: int, k: int, limit: float, free: set[int],
             journal: list[tuple[int, int]]) -> bool:
        journal.append((f, -1))
        self.place(f, k)
        self.budget = 500
        over = [a for a in self.var[f][k] if self.load[a] * self.inv[a] >= limit]
        return all(self._relieve(a, limit, free, journal, 2, {f}) for a in over)

    def improve(self, deadline: float, free: set[int] | None = None, depth: int = 3,
                target: float = 0.0) -> bool:
        """Lower the maximum utilisation level by level until a level cannot be cleared, the
        maximum is at `target` or time runs out; a failed level is rolled back. False when
        time ran out."""
        free = free if free is not None else set()
        self.stop = deadline
        try:
            while time.perf_counter() < deadline:
                u = self.util()
                top = float(np.max(u, initial=0.0))
                if top <= max(self.fixed_util, target) + EPS or top <= EPS:
                    return True
                limit = top - max(EPS, top * 1e-9)
                hot = self.hot(u, limit)
                journal: list[tuple[int, int]] = []
                self.budget = 20000 + 50 * len(hot)
                for a in hot:
                    if not self._relieve(a, limit, free, journal, depth, set()):
                        self._undo(journal, 0)
                        return time.perf_counter() < deadline
                free.update(f for f, _ in journal)
            return False
        finally:
            self.stop = float("inf")



    def restore(self, prev: Sequence[int], deadline: float | None = None) -> None:
        """Undo moves the final maximum does not need: a moved flow goes back to its previous
        path when that leaves every arc at or below the maximum reached; with a `deadline`
        (a re-plan, few moves) also when what that overloads can be relieved by moving only
        flows that have moved anyway (an ejection chain that saves a move)."""
        level = self.max_util()
        limit = level + max(EPS, level * 1e-9)
        if self._return_bulk(prev, limit):
            todo: deque[int] = deque()  # at its fixed point: no moved flow fits back
        else:
            todo = deque(f for f in sorted(self.touched)
                         if prev[f] >= 0 and self.assign[f] != prev[f])
        # a flow that cannot go back is tried again only when a return frees one of the arcs
        # it needs (loads elsewhere only rise): one pass plus the flows a return may help,
        # not passes over every moved flow until none returns
        waiting: dict[int, list[int]] = {}  # arc -> moved flows whose previous path uses it
        for f in todo:
            for a in self.var[f][prev[f]]:
                waiting.setdefault(a, []).append(f)
        queued = set(todo)
        while todo:
            f = todo.popleft()
            queued.discard(f)
            k, cur = prev[f], self.assign[f]
            if cur == k:
                continue
            d, mine, back = self.d[f], self.var[f][cur], self.var[f][k]
            if all((self.load[a] + d) * self.inv[a] < limit for a in back if a not in mine):
                self.lift(f)
                self.place(f, k)
                for a in mine:
                    if a not in back:
                        for g in waiting.get(a, ()):
                            if g not in queued and self.assign[g] != prev[g]:
                                todo.append(g)
                                queued.add(g)
        if deadline is None:
            return
        moved = self.moved(prev)
        for f in sorted(moved, key=lambda f: -self.d[f]):
            if time.perf_counter() >= deadline:
                return
            k = prev[f]
            if k < 0 or self.assign[f] == k:
                continue
            free = {g for g in moved if self.assign[g] != prev[g]} - {f}
            journal = [(f, self.assign[f])]
            self.lift(f)
            if not self._fit(f, k, limit, free, journal) or \
                    any(g not in free for g, _ in journal[2:]):
                self._undo(journal, 0)

    def swap(self, prev: Sequence[int], deadline: float) -> None:
        """Fewer moves at the same maximum where single returns (`restore`) find none: two
        moved flows (not displaced ones) go back to their previous paths and what that
        overloads is relieved by ejection chains that move flows that moved anyway and at
        most one other. Pairs whose paths (previous or present) share an arc first (one move
        near both is likelier to make room for both; unless there are more than `PAIRS` of
        them), then the rest; a pair that failed is not tried again, and after each gain the
        pairs are drawn afresh."""
        level = self.max_util()
        limit = level + max(EPS, level * 1e-9)
        failed: set[tuple[int, int]] = set()
        gained = True
        while gained:
            gained = False
            moved = self.moved(prev)
            back = [f for f in moved if prev[f] >= 0]
            near: dict[int, list[int]] = {}
            for f in back:
                for a in {*self.var[f][prev[f]], *self.var[f][self.assign[f]]}:
                    near.setdefault(a, []).append(f)
            close = sorted({(g, h) for fs in near.values() for i, g in enumerate(fs)
                            for h in fs[i + 1:]}) \
                if sum(len(fs) ** 2 for fs in near.values()) <= 2 * PAIRS else []
            rest = ((g, h) for i, g in enumerate(back) for h in back[i + 1:])
            free = set(moved)  # g and h are busy: never moved again in their chains
            for g, h in chain(close, rest):
                if time.perf_counter() >= deadline:
                    return
                if (g, h) in failed:
                    continue
                failed.add((g, h))
                journal = [(g, self.assign[g]), (h, self.assign[h])]
                for x in (g, h):
                    self.lift(x)
                    self.place(x, prev[x])
                over = [a for a in {*self.var[g][prev[g]], *self.var[h][prev[h]]}
                        if self.load[a] * self.inv[a] >= limit]
                self.budget, self.spent, self.allow, self.stop = 300, 0, 1, deadline
                ok = all(self._relieve(a, limit, free, journal, 2, {g, h}) for a in over)
                self.allow, self.stop = sys.maxsize, float("inf")
                if ok and len(self.moved(prev)) < len(moved):
                    gained = True
                    break
                self._undo(journal, 0)

    def blocking(self, prev: Sequence[int]) -> list[int]:
        """The flows in the way of moved flows' returns: not moved, on an arc of a moved
        flow's previous path that its return alone would take above the maximum."""
        limit = self.max_util() * (1 + 1e-9) + EPS
        out: set[int] = set()
        for g in self.moved(prev):
            k = prev[g]
            if k < 0:
                continue
            mine = self.var[g][self.assign[g]]
            for a in self.var[g][k]:
                if a not in mine and (self.load[a] + self.d[g]) * self.inv[a] > limit:
                    out.update(self.on[a])
        return sorted(f for f in out if self.assign[f] == prev[f])

    def _return_bulk(self, prev: Sequence[int], limit: float) -> bool:
        """restore's single returns in array steps, for a plan that moved thousands of flows:
        each round, every moved flow whose previous path fits under `limit` at the present
        loads goes back unless a flow before it returns onto one of the same arcs (it may fit
        in the next round: returns only free the arcs they leave). Ends where no moved flow
        fits, as the sequential returns do (each round's first flow always goes back: True;
        False when the moved flows are too few for it)."""
        moved = [f for f in sorted(self.touched) if prev[f] >= 0 and self.assign[f] != prev[f]]
        if len(moved) < BULK:
            return False
        pad = len(self.inv)
        B = _padded([self.var[f][prev[f]] for f in moved], pad)
        C = _padded([self.var[f][self.assign[f]] for f in moved], pad)
        width = max(B.shape[1], C.shape[1])
        B, C = (np.pad(X, ((0, 0), (0, width - X.shape[1])), constant_values=pad) for X in (B, C))
        D = np.asarray(self.d)[moved]
        # arcs of the previous path the flow is on now anyway gain nothing
        gain = ~(B[:, :, None] == C[:, None, :]).any(axis=2) & (B != pad)
        load = np.concatenate([self.loads(), [0.0]])
        inv = np.asarray(self.inv + [0.0])
        left = np.ones(len(moved), dtype=bool)
        while True:
            fits = ((load[B] + D[:, None]) * inv[B] < limit) | ~gain
            cand = np.flatnonzero(left & fits.all(axis=1))
            if not len(cand):
                break
            arcs, owner = B[cand][gain[cand]], np.repeat(cand, gain[cand].sum(axis=1))
            uniq, first = np.unique(arcs, return_index=True)
            clash = owner[first][np.searchsorted(uniq, arcs)] != owner
            late = np.zeros(len(moved), dtype=bool)
            late[owner[clash]] = True
            go = cand[~late[cand]]
            np.add.at(load, C[go].ravel(), -np.repeat(D[go], width))
            np.add.at(load, B[go].ravel(), np.repeat(D[go], width))
            load[pad] = 0.0
            left[go] = False
        gone = np.flatnonzero(~left).tolist()
        if not gone:
            return True
        for i in gone:
            self.assign[moved[i]] = prev[moved[i]]
        self.load = load[:pad].tolist()
        self.arr, self.dirty = None, set()
        self.on = _On()
        self._index([f for f, k in enumerate(self.assign) if k >= 0])
        return True

    # -- large neighbourhoods (HiGHS) -------------------------------------------------------
    def hood(self, seeds: Sequence[int], size: int, level: float | None = None) -> list[int]:
        """`seeds` and, breadth first, the flows on the arcs their candidates use: the flows
        whose moves can make room for them, up to `size`. With `level`, only arcs that could
        not take the largest seed without going above it are followed (moving flows off the
        others makes no room that is needed)."""
        out = dict.fromkeys(seeds)
        frontier = list(out)
        seen: set[int] = set()
        room = max((self.d[f] for f in seeds), default=0.0)
        while frontier and len(out) < size:
            nxt = []
            for f in frontier:
                for p in self.var[f]:
                    for a in p:
                        if a in seen:
                            continue
                        seen.add(a)
                        if level is not None and \
                                (self.load[a] + room) * self.inv[a] <= level + EPS:
                            continue
                        for g in sorted(self.on[a], key=lambda g: (-self.d[g], g)):
                            if g not in out:
                                out[g] = None
                                nxt.append(g)
                if len(out) >= size:
                    break
            frontier = nxt
        return list(out)[:max(size, len(seeds))]

    def reassign(self, new: dict[int, int]) -> None:
        """Put each flow on the candidate given (-1: unplaced)."""
        for f, k in new.items():
            if self.assign[f] != k:
                if self.assign[f] >= 0:
                    self.lift(f)
                if k >= 0:
                    self.place(f, k)

    def search(self, deadline: float, prev: Sequence[int] | None) -> None:
        """Large-neighbourhood search: re-place the flows on some of the busiest arcs and
        their neighbours optimally (min-max MILP, every other flow fixed); each success leaves
        fewer arcs at the maximum, until it drops. A neighbourhood that cannot is enlarged
        once, then the search stops (the maximum cannot drop while that arc stays)."""
        size = 200
        changed = False
        while time.perf_counter() < deadline - 0.01:
            u = self.util()
            top = float(np.max(u, initial=0.0))
            if top <= self.fixed_util + EPS:
                break
            seeds: dict[int, None] = {}
            for a in self.hot(u, top - EPS):
                seeds.update(dict.fromkeys(sorted(self.on[a])))
                if len(seeds) >= size // 2:
                    break
            got = sub_milp(self, self.hood(list(seeds), size), None, None, True,
                           deadline, hold=top)
            if got.value is None or got.value >= top - EPS:
                if size >= HOOD:
                    break
                size = HOOD
                continue
            self.reassign(got.assign)
            self.improve(deadline)
            changed = True
        if prev is not None and changed:  # else restore's fixed point holds (66 ms at 32k flows)
            self.restore(prev)

    def whole(self, deadline: float, prev: Sequence[int] | None, bound: float) -> None:
        """Where whole flows bound the maximum above the LP (a few large flows share few
        links: `bound`, `_cut_bound`) and the plan is above that bound, ask HiGHS for a
        placement of every flow at the bound, then undo the moves from `prev` it does not
        need."""
        if self.max_util() <= bound + EPS:
            return
        # HiGHS's presolve took 0.4-0.6 s of the 0.6-0.8 s it needed here (dual-plane at
        # 1,024 GPUs); without it, 0.1-0.3 s
        got = sub_milp(self, range(self.inst.flows), bound, None, True, deadline,
                       presolve=False)
        if got.found:
            self.reassign(got.assign)
            if prev is not None:
                self.restore(prev)

    def fewest_moves(self, prev: Sequence[int], deadline: float,
                     free: Sequence[int] | None = None) -> None:
        """Replace the moves made so far by the fewest that keep every arc at or below the
        maximum reached: a MILP over `free` or the flows that may need to move (`movers`;
        over the moved flows' neighbourhood when those are too many), every other flow
        fixed."""
        moved = self.moved(prev)
        level = self.max_util()
        if free is None:
            # a wider set solves faster when there is time to set it up
            wide = deadline - time.perf_counter() > 0.2
            free = self.movers(moved, level, MOVERS if wide else 400)
            if free is None:
                free = self.hood(moved, max(4 * len(moved), HOOD if wide else 400), level)
        got = sub_milp(self, free, level, prev, True, deadline)
        if not got.found:
            return
        journal = [(f, self.assign[f]) for f in got.assign]
        before = len(moved)
        self.reassign(got.assign)
        if len(self.moved(prev)) >= before or self.max_util() > level + EPS:
            self.reassign(dict(journal))  # not better after all (rounding): keep the moves

    def movers(self, moved: Sequence[int], level: float, most: int) -> list[int] | None:
        """Every flow an assignment with the fewest moves keeping every arc at or below
        `level` may move (`moved`, the flows moved now, included; the others are at their
        previous paths): start from `moved`; an arc is tight when the flows outside the set
        plus every flow of the set that has a candidate over it could exceed `level` there;
        flows outside the set on a tight arc join it, until none does. A flow left out never
        has to move: taking it off its path frees only arcs that cannot overflow. None when
        the set grows past `most`."""
        limit = level * (1 + 1e-9) + EPS
        load = self.loads().copy()
        cap = self.inst.cap
        out = dict.fromkeys(moved)
        reach = np.zeros(len(load))  # per arc: demand of the set's flows that could use it
        todo = list(out)
        while todo:
            for f in todo:
                d = self.d[f]
                k = self.assign[f]
                if k >= 0:
                    load[list(self.var[f][k])] -= d
                over = {a for p in self.var[f] for a in p}
                reach[list(over)] += d
            tight = np.flatnonzero(load + reach > limit * cap).tolist()
            todo = []
            for a in tight:
                for g in self.on[a]:
                    if g not in out:
                        out[g] = None
                        todo.append(g)
                if len(out) > most:
                    return None
        return list(out)

def _orders(flows: Sequence[int], d: Sequence[float]) -> Iterator[tuple[list[int], bool]]:
    """Orders to insert displaced flows in, each with whether a link is first relieved by a
    harmless move: largest first with and without, then shuffles with (seeded: the same
    input gets the same orders)."""
    base = sorted(flows, key=lambda f: -d[f])
    yield base, True
    yield base, False
    rng = random.Random(len(base))
    while True:
        order = list(base)
        rng.shuffle(order)
        yield order, True


def _padded(paths: Sequence[tuple[int, ...]], pad: int) -> np.ndarray:
    """One row per path, filled up with `pad` to the longest (array steps only)."""
    lens = np.fromiter(map(len, paths), dtype=np.intp, count=len(paths))
    flat = np.fromiter(chain.from_iterable(paths), dtype=np.intp, count=int(lens.sum()))
    out = np.full((len(paths), max(int(lens.max(initial=0)), 1)), pad, dtype=np.intp)
    first = np.cumsum(lens) - lens
    out[np.repeat(np.arange(len(paths)), lens), np.arange(len(flat)) - np.repeat(first, lens)] = flat
    return out


P = ParamSpec("P")
R = TypeVar("R")


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """Run `fn` with the cyclic garbage collector paused: the optimiser allocates many small
    objects and no cycles, and each full collection walks every object of the model (at
    32,768 flows that cost a plan up to a second)."""
    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return run


def _usable(inst: Instance, prev: Sequence[int]) -> tuple[list[int], list[int]]:
    """`prev` with -1 for every index that is no candidate, and the flows with -1."""
    k = np.asarray(prev, dtype=np.intp)
    n = np.fromiter(map(len, inst.cand), dtype=np.intp, count=len(inst.cand))
    k = np.where((k >= 0) & (k < n), k, -1)
    return k.tolist(), np.flatnonzero(k < 0).tolist()


def _result(st: _State, prev: Sequence[int] | None, t0: float) -> Result:
    return Result(list(st.assign), st.max_util(), st.moved(prev), time.perf_counter() - t0)


class Engine:
    """The optimiser as the aggregator keeps it between plans: the split of each candidate
    list (by list object; model.Model gives an unchanged endpoint pair the same one) is
    computed once, and the state of the last plan is kept: a re-plan updates only the flows
    (by position) whose candidates or demand changed, the arcs whose base load or capacity
    changed and the flows whose path differs from `prev`."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[list[tuple[int, ...]], Split]] = {}
        self.last: _State | None = None
        # the flows where they were when the last plan was made: a re-plan starts from it
        # when that plan was not applied (moving thousands of flows back is slow). Set up
        # after the plan is out (`settle`: 0.1 s at 32,768 flows), or by the re-plan that
        # needs it first; until then the input and placement it is made from
        self.placed: _State | None = None
        self.unsettled: tuple[Instance, list[int]] | None = None
        # the last `splits` asked for and its answer: a plan asks for the same list 2-3
        # times (elastic demand, the plan's state), 20 ms each at 32,768 flows
        self.asked: tuple[list[list[tuple[int, ...]]], list[Split]] | None = None

    def split(self, c: list[tuple[int, ...]]) -> Split:
        got = self.memo.get(id(c))
        if got is None or got[0] is not c:
            got = self.memo[id(c)] = (c, _split(c))
        return got[1]

    def splits(self, cand: list[list[tuple[int, ...]]]) -> list[Split]:
        """`split` of each flow's list: the kept ones, the new ones split together; the
        lists no flow has any more are forgotten."""
        if self.asked is not None and self.asked[0] is cand and \
                len(self.asked[1]) == len(cand):
            return self.asked[1]
        ids = list(map(id, cand))
        fresh: dict[int, tuple[list[tuple[int, ...]], Split]] = {}
        new: dict[int, list[tuple[int, ...]]] = {}
        for i, c in zip(ids, cand):
            if i in fresh or i in new:
                continue
            got = self.memo.get(i)
            if got is not None and got[0] is c:
                fresh[i] = got
            else:
                new[i] = c
        fresh.update(zip(new, zip(new.values(), _split_all(list(new.values())))))
        self.memo = fresh  # holds the lists, so an id is not reused while it is a key
        out = [fresh[i][1] for i in ids]
        self.asked = (cand, out)
        return out

    def settle(self) -> None:
        """Set up the state a re-plan of an unapplied plan starts from (`placed`), which
        `plan` leaves for after its result is out."""
        if self.unsettled is not None:
            inst, assign = self.unsettled
            self.unsettled = None
            self.placed = self.state(inst)
            self.placed.place_all(assign)

    def state(self, inst: Instance) -> _State:
        """A fresh state, nothing placed."""
        sp = self.splits(inst.cand)
        return _State(inst, [s[0] for s in sp], [s[1] for s in sp])

    def _carry(self, st: _State, inst: Instance) -> _State:
        """A kept state brought up to `inst` (same arcs): only the flows whose candidate
        list or demand changed (or that are new or gone: the flows are by position) and the
        arcs whose base load or capacity changed are updated."""
        old = st.inst
        n, m = inst.flows, min(inst.flows, old.flows)
        for f in range(n, old.flows):  # gone: the state ends where inst does
            self._swap(st, f, None, 0.0)
        del st.assign[n:], st.d[n:], st.var[n:], st.com[n:]
        st.touched = {f for f in st.touched if f < n}
        same = np.fromiter(map(operator.is_, old.cand[:m], inst.cand[:m]), dtype=bool, count=m)
        changed = np.flatnonzero(~same | (old.demand[:m] != inst.demand[:m])).tolist()
        new_d = inst.demand.tolist()
        for f in changed:
            self._swap(st, f, inst.cand[f], new_d[f])
        for f in range(m, n):  # new
            st.assign.append(-1)
            st.d.append(0.0)
            st.com.append(())
            st.var.append([])
            self._swap(st, f, inst.cand[f], new_d[f])
        for a in np.flatnonzero(inst.base != old.base).tolist():
            delta = float(inst.base[a] - old.base[a])
            st.fixed[a] += delta
            st.load[a] += delta
        if not np.array_equal(inst.cap, old.cap):
            st.inv = (1.0 / inst.cap).tolist()
        st.fixed_util = float(np.max(st.fixed / inst.cap))
        st.inst = inst
        st.arr = None  # loads changed in place above
        return st

    def _swap(self, st: _State, f: int, cand: list[tuple[int, ...]] | None, d: float) -> None:
        """Flow f of the state lifted, its shared arcs' load taken off and, with `cand`, put
        back with its new candidates and demand (unplaced)."""
        if st.assign[f] >= 0:
            st.lift(f)
        for a in st.com[f]:
            st.fixed[a] -= st.d[f]
            st.load[a] -= st.d[f]
        if cand is None:
            return
        st.com[f], st.var[f] = self.split(cand)
        st.d[f] = d
        for a in st.com[f]:
            st.fixed[a] += d
            st.load[a] += d

    def _begin(self, inst: Instance, prev: Sequence[int]) -> _State:
        """A state with the flows on `prev`: of the kept ones (the last plan's, the flows
        where they were when it was made) the one fewest flows differ from, brought up to
        date; a new one without."""
        want = np.asarray(prev)

        def differ(assign: list[int]) -> int:
            m = min(len(assign), len(want))
            return int(np.count_nonzero(np.asarray(assign[:m]) != want[:m])) + \
                abs(len(assign) - len(want))

        # (differs, the last plan's state?) of each kept state that fits; the placement one
        # is set up only when chosen
        kept: list[tuple[int, bool]] = []
        if self.last is not None and len(self.last.inst.cap) == len(inst.cap):
            kept.append((differ(self.last.assign), False))
        placement = self.unsettled if self.placed is None else \
            (self.placed.inst, self.placed.assign)
        if placement is not None and len(placement[0].cap) == len(inst.cap):
            kept.append((differ(placement[1]), True))
        st = None
        if kept and not min(kept)[1]:
            st = self.last
        elif kept:
            self.settle()
            st, self.placed = self.placed, None
        if st is None:
            st = self.state(inst)
            st.place_all(prev)
        else:
            st = self._carry(st, inst)
            for f in np.flatnonzero(np.asarray(st.assign) != want).tolist():
                if st.assign[f] >= 0:
                    st.lift(f)
                if prev[f] >= 0:
                    st.place(f, prev[f])
        st.touched = set()
        self.last = st
        return st

    @without_gc
    def plan(self, inst: Instance, current: Sequence[int] | None = None,
             budget_s: float = 0.5) -> Result:
        """A full plan. `current[f]`: the candidate flow f uses now (-1: unknown); `moved`
        counts flows whose path changes against it. Greedy from scratch (ties keep the current
        path), improvement, then large-neighbourhood search in what is left of the budget;
        when the flows' current paths are all known and that placement is no worse, the same
        search from it competes, so a plan is never worse than leaving the flows where they
        are, and moves only what lowers the maximum. The next re-plan starts from this plan's
        state."""
        t0 = time.perf_counter()
        deadline = t0 + budget_s
        complete = current is not None and all(k >= 0 for k in current)
        st = self.state(inst)
        st.greedy(range(inst.flows), current)
        st.improve(deadline)
        if current is not None:
            st.restore(current)
        # the whole-flow bound depends on the candidates only: one for every state (24-106
        # ms at 2,048-8,192 flows), computed when first needed
        cut = functools.cache(functools.partial(_cut_bound, st))
        st = self._restarts(st, inst, current, t0, t0 + RESTARTS * budget_s, cut)
        # the search from scratch gets half of what is left when the current placement
        # competes, which it can only where it is no worse than this state (the search never
        # rises); a half kept for it regardless starved the placement at the whole-flow bound
        # (dual-plane at 1,024 GPUs stayed at 2.0 for 1.75)
        now_util = max_util(inst, current) if complete and current is not None else math.inf
        compete = now_util <= st.max_util() + EPS
        mid = deadline if not compete else (time.perf_counter() + deadline) / 2
        if inst.flows <= WHOLE:
            st.whole(mid, current, cut())
        st.search(mid, current)
        best = _result(st, current, t0)
        self.last = st
        if compete and current is not None and now_util <= best.max_util + EPS:
            self.last = None  # the search from the current paths needs a state of its own
            kept = self.replan(inst, current, max(0.0, deadline - time.perf_counter()),
                               search=True)
            if kept.max_util <= best.max_util + EPS:
                best = kept
            else:
                self.last = st
        self.placed = None
        self.unsettled = (inst, _usable(inst, current)[0]) if current is not None else None
        best.seconds = time.perf_counter() - t0
        return best

    def _restarts(self, st: _State, inst: Instance, current: Sequence[int] | None,
                  t0: float, until: float, cut: Callable[[], float]) -> _State:
        """The greedy again with equal demands in other orders, each improved, while one
        more fits before `until` (each costs about what the first did); the lowest maximum
        wins. Improvement stops at the first level it cannot clear, and where it stops
        depends on that order: at 1,024 GPUs (bench/planner's `jobs`) the first stops at
        1.625 where others reach 1.525, the best HiGHS finds in minutes (test_planner.py)."""
        cost = time.perf_counter() - t0
        if inst.flows <= HOOD or time.perf_counter() + cost >= until:
            return st  # the search's MILP takes every flow: it finds what an order would
        floor = max(st.fixed_util, cut())  # no order goes below
        rng = random.Random(inst.flows)
        order = list(range(inst.flows))
        while st.max_util() > floor + EPS and time.perf_counter() + cost < until:
            rng.shuffle(order)
            alt = self.state(inst)
            alt.greedy(order, current)
            alt.improve(until)
            if current is not None:
                alt.restore(current)
            if alt.max_util() < st.max_util() - EPS:
                st = alt
        return st

    @without_gc
    def replan(self, inst: Instance, prev: Sequence[int], budget_s: float = 0.1,
               target: float = 0.0, search: bool = False) -> Result:
        """Re-plan from `prev` (per flow: candidate index, -1 where the old path is no longer
        usable or unknown): displaced flows go on their best alternative largest first, then
        improvement relieves overloaded arcs, moving displaced flows first; every other flow
        moves only to lower the maximum utilisation, and not at all once it is at or below
        `target` (a re-plan after a failure restores the utilisation the plan had before it;
        a full plan improves further, with large-neighbourhood search when `search`). The
        lower maximum wins, then the fewer moves. Moves the final maximum does not need are
        undone: single returns, ejection chains among moved flows, pairs of moved flows back
        for one other move (`swap`, after pass 1 and with what the passes leave), a MILP
        over the moved flows (which of them go back) and the flows in the way of their
        returns, and with time left one over their neighbourhood. The last plan's state is
        carried over instead of set up again."""
        t0 = time.perf_counter()
        deadline = t0 + max(budget_s, 0.0)
        prev, displaced = _usable(inst, prev)
        st = self._begin(inst, prev)
        # where the maximum can go: displaced flows where their busiest arc ends lowest, then
        # improvement down to `target`
        st.greedy(displaced)
        # the phases share what setting up left (a loaded machine can take half of it)
        t1 = time.perf_counter()
        span = max(deadline - t1, 0.0)
        stuck = st.improve(t1 + span / 3, set(displaced), target=target)
        st.restore(prev)
        level = st.max_util()
        if len(st.moved(prev)) > len(displaced):
            # which moved flows can go back, the others re-placed among their candidates: a
            # MILP over the moved flows alone takes a few ms and finds returns that single
            # moves and ejection chains miss
            st.fewest_moves(prev, min(time.perf_counter() + BACK, t1 + span * 4 / 9),
                            st.moved(prev))
        if not search:
            # then pairs of moved flows back for one new move each (a share of the budget)
            st.swap(prev, time.perf_counter() + span * SWAP)
        first = {f: st.assign[f] for f in st.moved(prev)}
        # the same level again, each displaced flow where the fewest others must move: with
        # and without trying a harmless move first (each wins on some fabrics), then, when
        # one of those reached the level, in other orders while time is left (the order
        # decides which flows the first ones push out); the fewest moves kept
        tries: list[tuple[bool, int, int, dict[int, int]]] = []
        stop = deadline - BACK - span / 6
        longest = 0.0
        for i, (order, direct) in enumerate(_orders(displaced, st.d)):
            now = time.perf_counter()
            if i >= 2 and (i >= 2 + TRIES or now + longest > stop or min(tries)[0] or
                           min(tries)[1] == len(displaced)):
                # out of time or orders; neither first order reached the level (the time
                # goes to improvement); or nothing but the displaced flows moved
                break
            st.reassign({f: prev[f] for f in st.moved(prev)})
            fits = st.insert(order, level, max(t1 + span * (4 + i) / 9, now + span / 9)
                             if i < 2 else stop, direct)
            longest = max(longest, time.perf_counter() - now)
            tries.append((not fits, len(st.moved(prev)), i,
                          {f: st.assign[f] for f in st.moved(prev)}))
        best = min(tries)
        fits = not best[0]
        st.reassign({f: prev[f] for f in st.moved(prev)})
        st.reassign(best[3])
        # time kept for the MILP over the moved flows at the end
        end = deadline if search else deadline - BACK
        if search or not (stuck and fits):
            # pass 1 stopped at a level it could not clear: a second try is left out unless a
            # full plan asks for it or the insertion missed the level
            st.improve(end, set(st.moved(prev)), target=target)
        if search:
            st.search(deadline, prev)
        st.restore(prev, end)
        # pass 1's result wins when the maximum is no lower and it moved fewer
        if st.max_util() > level + EPS or (st.max_util() >= level - EPS
                                              and len(st.moved(prev)) > len(first)):
            st.reassign({f: prev[f] for f in st.moved(prev)})
            st.reassign(first)
            st.restore(prev, end)
        if not search:
            st.swap(prev, deadline - BACK)  # with what the passes left
        if len(st.moved(prev)) > len(displaced) and \
                time.perf_counter() < deadline - BACK / 2:  # setting it up takes ms too
            # as above, the flows in the way of returns added when there is time to set
            # that up (a few ms more; single and paired returns could not move them)
            free = st.moved(prev)
            wide = free if search else free + st.blocking(prev)
            if SETUP * sum(map(len, (st.var[f] for f in wide))) < \
                    deadline - time.perf_counter() - BACK / 2:
                free = wide
            st.fewest_moves(prev, deadline, free)
        if len(st.moved(prev)) > len(displaced) and time.perf_counter() < deadline - 2 * TAIL:
            st.fewest_moves(prev, deadline - TAIL)
        return _result(st, prev, t0)


def plan(inst: Instance, current: Sequence[int] | None = None,
         budget_s: float = 0.5) -> Result:
    """A full plan with a fresh engine (Engine.plan)."""
    return Engine().plan(inst, current, budget_s)


def replan(inst: Instance, prev: Sequence[int], budget_s: float = 0.1,
           target: float = 0.0) -> Result:
    """A re-plan with a fresh engine (Engine.replan)."""
    return Engine().replan(inst, prev, budget_s, target)


# -- MILPs (HiGHS) ----------------------------------------------------------------------------
class Milp(NamedTuple):
    """What `sub_milp` got: HiGHS's model status (`Optimal`, `Infeasible`, `Time limit
    reached`, ...; `no time` where the deadline left none to set the model up), the value
    (None: no solution), each free flow's candidate (integral only) and whether the value is
    proven optimal."""

    status: str
    value: float | None
    assign: dict[int, int]
    optimal: bool

    @property
    def found(self) -> bool:
        return self.value is not None


def sub_milp(st: _State, free: Sequence[int], level: float | None,
             prev: Sequence[int] | None, integral: bool, deadline: float,
             hold: float | None = None, warm_start: bool = True,
             presolve: bool = True) -> Milp:
    """Re-place the flows in `free` over their candidates, every other flow where it is.
    `level` None: minimise the maximum utilisation (returned); with `hold`, arcs the fixed
    flows alone keep at `hold` or above only must not rise above it and are left out of the
    maximum (so the value says whether the other arcs got below `hold`); else: keep every arc at or
    below `level` and minimise the flows of `free` that leave `prev` (the count is returned;
    prev -1 counts as moved). Flows with the same candidate list, demand (integral) and
    previous path are one integer class. Returns the value (the maximum over the arcs the
    free flows may use, or the number of moves), each free flow's candidate (integral only)
    and whether HiGHS proved it optimal (`Milp`; no value when it finds no solution by
    `deadline`, perf_counter, setting the model up counted). `warm_start`: hand HiGHS the flows' present
    candidates as a first solution (when every free flow has one)."""
    if not free or deadline - time.perf_counter() < SETUP * sum(len(st.var[f]) for f in free):
        return Milp("no time", None, {}, False)  # HiGHS checks its limit once set up
    inst = st.inst
    scale = 1.0 / float(np.max(inst.cap))
    cap = inst.cap * scale
    rest = st.loads() * scale
    classes: dict[tuple[int, float, int], list[int]] = {}
    for f in free:
        k = st.assign[f]
        if k >= 0:
            for a in st.var[f][k]:
                rest[a] -= st.d[f] * scale
        key = (id(st.var[f]), st.d[f] if integral else 0.0, prev[f] if prev is not None else -1)
        classes.setdefault(key, []).append(f)
    rows: dict[int, int] = {}
    for members in classes.values():
        for p in st.var[members[0]]:
            for a in p:
                rows.setdefault(a, len(rows))
    n_rows = len(rows)
    arc_of = np.fromiter(rows, dtype=np.intp, count=n_rows)
    start, index, value, lower, upper, cost, warm = [0], [], [], [], [], [], []
    minmax = level is None
    stuck = np.zeros(n_rows, dtype=bool)
    if minmax:  # the column z: every arc row gets -cap * z
        if hold is not None:
            stuck = rest[arc_of] >= (hold - EPS) * cap[arc_of]
        live = np.flatnonzero(~stuck)
        index.extend(live.tolist())
        value.extend((-cap[arc_of[live]]).tolist())
        start.append(len(index))
        lower.append(st.fixed_util)  # no arc goes below its fixed load
        upper.append(highspy.kHighsInf)
        cost.append(1.0)
        warm.append(float(np.max(st.loads()[arc_of[live]] * scale / cap[arc_of[live]],
                                 initial=st.fixed_util)))
    cols: list[tuple[list[int], int]] = []
    for c, ((_, dem, pk), members) in enumerate(classes.items()):
        unit = dem * scale if integral else 1.0
        total = float(len(members)) if integral else sum(st.d[f] for f in members) * scale
        for k, p in enumerate(st.var[members[0]]):
            index.extend(rows[a] for a in sorted(set(p)))
            value.extend([unit] * len(set(p)))
            index.append(n_rows + c)
            value.append(1.0)
            start.append(len(index))
            lower.append(0.0)
            upper.append(total)
            cost.append(-1.0 if not minmax and k == pk else 0.0)
            warm.append(float(sum(1 for f in members if st.assign[f] == k)))
            cols.append((members, k))
    lp = highspy.HighsLp()
    lp.num_col_ = len(cost)
    lp.num_row_ = n_rows + len(classes)
    lp.col_cost_ = np.array(cost)
    lp.col_lower_ = np.array(lower)
    lp.col_upper_ = np.array(upper)
    if level is None:
        arc_hi = np.where(stuck, (hold or 0.0) * cap[arc_of], 0.0) - rest[arc_of]
    else:
        arc_hi = level * cap[arc_of] - rest[arc_of] + 1e-9
    totals = [float(len(m)) if integral else sum(st.d[f] for f in m) * scale
              for m in classes.values()]
    lp.row_lower_ = np.r_[np.full(n_rows, -highspy.kHighsInf), totals]
    lp.row_upper_ = np.r_[arc_hi, totals]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(start, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value)
    if integral:
        lp.integrality_ = ([highspy.HighsVarType.kContinuous] if minmax else []) + \
            [highspy.HighsVarType.kInteger] * len(cols)
    h = highspy.Highs()  # type: ignore[no-untyped-call]  # highspy 1.16: __init__ unannotated
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(1e-3, deadline - time.perf_counter()))
    h.setOptionValue("threads", 1)
    if not presolve:
        h.setOptionValue("presolve", "off")
    if integral:
        h.setOptionValue("mip_rel_gap", 1e-6)
    h.passModel(lp)
    started = integral and warm_start and all(k >= 0 for k in (st.assign[f] for f in free))
    if started:
        sol = highspy.HighsSolution()
        sol.col_value = warm
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    if h.getInfo().primal_solution_status != 2:  # no feasible point: proved, or a limit
        return Milp(status, None, {}, False)
    optimal = status == "Optimal"
    x = h.getSolution().col_value
    reported = float(h.getInfo().objective_function_value)
    if started and abs(float(np.dot(cost, x)) - reported) > 1e-6 * max(1.0, abs(reported)):
        # HiGHS (1.16) can report a better incumbent than the solution it hands back (the
        # start it was given): solve again without the start
        return sub_milp(st, free, level, prev, integral, deadline, hold, warm_start=False,
                        presolve=presolve)
    obj = reported + (0 if minmax else len(free))
    if not integral:
        return Milp(status, obj, {}, optimal)
    new: dict[int, int] = {}
    x = x[1:] if minmax else x
    by_class: dict[int, list[tuple[int, int]]] = {}
    for (members, k), v in zip(cols, x):
        n = int(round(v))
        if n:
            by_class.setdefault(id(members), []).append((k, n))
    for members in classes.values():
        want = dict(by_class.get(id(members), []))
        if sum(want.values()) != len(members):
            return Milp("rounding: a class's columns do not add up", None, {}, False)
        rest_m = []
        for f in members:  # members that may stay, stay
            k = st.assign[f]
            if k >= 0 and want.get(k, 0) > 0:
                want[k] -= 1
                new[f] = k
            else:
                rest_m.append(f)
        ks = [k for k, n in want.items() for _ in range(n)]
        new.update(zip(rest_m, ks))
    return Milp(status, obj, new, optimal)


def _bound(inst: Instance, integral: bool, time_limit: float) -> float | None:
    st = Engine().state(inst)
    got = sub_milp(st, range(inst.flows), None, None, integral,
                   time.perf_counter() + time_limit)
    return max(got.value, st.fixed_util) if got.optimal and got.value is not None else None


def lp_bound(inst: Instance, time_limit: float = 60.0) -> float | None:
    """The LP relaxation's maximum utilisation: no plan over these candidates goes lower."""
    return _bound(inst, False, time_limit)


def milp_optimum(inst: Instance, time_limit: float = 60.0) -> float | None:
    """The integral optimum, None when HiGHS does not prove it within `time_limit`."""
    return _bound(inst, True, time_limit)


def best_known(inst: Instance, assign: Sequence[int], step: float,
               time_limit: float = 60.0) -> tuple[float, bool]:
    """Descend from `assign` by asking HiGHS for a placement of every flow at `step` below
    the maximum reached, `time_limit` seconds per ask (presolve off: far faster on these
    feasibility MILPs). Returns the lowest maximum found and whether HiGHS proved the last
    ask infeasible (then no plan is `step` or more below it)."""
    st = Engine().state(inst)
    st.place_all(assign)
    while True:
        t0 = time.perf_counter()
        top = st.max_util()
        got = sub_milp(st, range(inst.flows), top - step, None, True, t0 + time_limit,
                       presolve=False, warm_start=False)
        if not got.found:
            return top, got.status == "Infeasible"
        st.reassign(got.assign)
        if st.max_util() > top - step + EPS:  # within HiGHS's tolerance only
            return top, False


def cut_bound(inst: Instance) -> float:
    """A lower bound on the integral optimum that the LP relaxation misses: flows are whole.
    Where a flow's candidates all have the same number of varying arcs, each step of them
    (the first uplink, the downlink to the destination leaf, ...) takes exactly one arc of
    a set; arcs that share such a set join one cut (a leaf's uplinks in every plane, a
    destination leaf's downlinks). The flows with a step inside a cut are packed whole onto
    its m arcs (of one capacity), on top of the load each carries anyway: whichever arcs they
    may use, some arc gets k + 1 of the k*m + 1 largest, so at least the smallest k + 1 of
    those, plus the least load an arc of the cut carries anyway. The largest such bound over
    the cuts and k is returned (0.0: none)."""
    return _cut_bound(Engine().state(inst))


def _cut_bound(st: _State) -> float:
    inst = st.inst
    parent: dict[int, int] = {}

    def root(a: int) -> int:
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    steps: list[tuple[int, int]] = []  # (flow, step)
    for f in range(inst.flows):
        var = st.var[f]
        if len(var) < 2 or len({len(p) for p in var}) != 1:
            continue
        for j in range(len(var[0])):
            steps.append((f, j))
            for p in var[1:]:
                parent[root(p[j])] = root(var[0][j])
    cuts: dict[int, set[int]] = {}  # cut -> the flows with a step inside it
    for f, j in steps:
        cuts.setdefault(root(st.var[f][0][j]), set()).add(f)
    members: dict[int, list[int]] = {}
    for a in parent:
        members.setdefault(root(a), []).append(a)
    fixed = np.asarray(st.fixed)
    best = 0.0
    for cut, mine in cuts.items():
        arcs = members[cut]
        cap = inst.cap[arcs]
        if np.ptp(cap) > 0:
            continue
        m = len(arcs)
        d = np.sort(inst.demand[list(mine)])[::-1]
        floor = float(fixed[arcs].min())
        for k in range(1, len(d) // m + 1):
            if k * m < len(d):
                best = max(best, (floor + float(d[k * m - k:k * m + 1].sum())) / cap[0])
    return best


def min_moves(inst: Instance, prev: Sequence[int], level: float,
              time_limit: float = 10.0) -> int | None:
    """The fewest flows any assignment with maximum utilisation <= `level` must move away
    from `prev` (-1: displaced, counts as moved), or None when HiGHS does not prove it in
    time. The benchmark and tests compare a re-plan's moves with this; up to `CHECKED` flows
    it is solved twice, with and without presolve (which once proved a count too high)."""
    st = Engine().state(inst)
    prev = _usable(inst, prev)[0]
    st.place_all(prev)
    deadline = time.perf_counter() + time_limit
    got = sub_milp(st, range(inst.flows), level, prev, True, deadline)
    if not got.optimal or got.value is None:
        return None
    if inst.flows <= CHECKED:
        # HiGHS 1.16's presolve once proved 11 moves optimal where 10 do (the re-plan found
        # them; without presolve HiGHS finds them too): the fewer of both proven counts
        again = sub_milp(st, range(inst.flows), level, prev, True, deadline, presolve=False)
        if again.optimal and again.value is not None:
            return int(round(min(got.value, again.value)))
    return int(round(got.value))

"""The C4P optimisation: give every flow one of its known paths so that the most utilised
directed link (load / capacity) is as low as possible, moving as few flows as possible.

Pure arithmetic on indices: the caller (service.py) turns topology, path map and flows into an
`Instance` and the chosen path indices back into source ports.

- `plan`: largest-first greedy, then local improvement (single moves and two-move ejection
  chains off the bottleneck links); the same improvement is also run from the flows' current
  paths, and the better result wins (fewer moves on a tie), so a plan is never worse than
  leaving the flows where ECMP put them.
- `replan`: keeps every flow whose path is still usable, re-inserts the others largest first,
  then improves with moves of already-displaced flows first. Improvement works in levels: a
  level lowers the maximum utilisation or is rolled back, so a flow that was not displaced
  moves only when that strictly lowers the maximum.
- `lp_bound` / `milp_optimum` (HiGHS, benchmark and tests only): the LP relaxation over the
  same candidate paths is the lower bound no plan can beat; the MILP is the integral optimum.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

EPS = 1e-9
CHUNK = 128  # flows scored per array step in the greedy


@dataclass
class Instance:
    """cap: capacity per directed link (arc); demand per flow; cand[f]: the distinct paths flow
    f may take, each a tuple of arc indices; base: load already on each arc from traffic the
    plan does not place (flows with unknown paths)."""

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
        if any(not c for c in self.cand):
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


def loads(inst: Instance, assign: Sequence[int]) -> np.ndarray:
    load = inst.base.astype(np.float64).copy()
    for f, k in enumerate(assign):
        for a in inst.cand[f][k]:
            load[a] += inst.demand[f]
    return load


def max_util(inst: Instance, assign: Sequence[int]) -> float:
    return float(np.max(loads(inst, assign) / inst.cap)) if len(inst.cap) else 0.0


class _State:
    """Assignment + per-arc loads over the arcs that differ between a flow's candidates (the
    arcs every candidate shares are constant and folded into `fixed`)."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        n_arcs = len(inst.cap)
        self.inv = (1.0 / inst.cap).tolist()
        fixed = inst.base.astype(np.float64).copy()
        self.var: list[list[tuple[int, ...]]] = []
        self.d = inst.demand.tolist()
        # flows between the same endpoints share one candidate list (model.build): split it
        # into shared and varying arcs once
        memo: dict[int, tuple[tuple[int, ...], list[tuple[int, ...]]]] = {}
        arcs: list[int] = []
        owners: list[int] = []
        for f, paths in enumerate(inst.cand):
            got = memo.get(id(paths))
            if got is None:
                p0 = paths[0]
                common = set(p0).intersection(*paths[1:]) if len(paths) > 1 else set(p0)
                if len(common) == 2 and p0[0] in common and p0[-1] in common and \
                        all(p[0] == p0[0] and p[-1] == p0[-1] for p in paths):
                    var = [p[1:-1] for p in paths]  # the usual case: shared NIC links
                else:
                    var = [tuple(a for a in p if a not in common) for p in paths]
                got = memo[id(paths)] = (tuple(common), var)
            arcs.extend(got[0])
            owners.extend([f] * len(got[0]))
            self.var.append(got[1])
        np.add.at(fixed, np.array(arcs, dtype=np.intp), inst.demand[np.array(owners, dtype=np.intp)])
        self.fixed_util = float(np.max(fixed / inst.cap)) if n_arcs else 0.0
        self.load = fixed.tolist()
        self.assign = [-1] * inst.flows
        self.on: defaultdict[int, set[int]] = defaultdict(set)  # arc -> flows on it
        self.budget = 0

    def place(self, f: int, k: int) -> None:
        d = self.d[f]
        for a in self.var[f][k]:
            self.load[a] += d
            self.on[a].add(f)
        self.assign[f] = k

    def lift(self, f: int) -> None:
        k = self.assign[f]
        d = self.d[f]
        for a in self.var[f][k]:
            self.load[a] -= d
            self.on[a].discard(f)
        self.assign[f] = -1

    def util(self) -> list[float]:
        return [x * i for x, i in zip(self.load, self.inv)]

    def max_util(self) -> float:
        return max(max((x * i for x, i in zip(self.load, self.inv)), default=0.0),
                   self.fixed_util)

    def greedy(self, flows: Sequence[int], prefer: Sequence[int] | None = None) -> None:
        """Place `flows` largest first, each on the candidate whose busiest arc ends lowest
        (then the lowest total), keeping `prefer[f]` on a tie.

        Vectorised without changing the result of some largest-first order: flows of about
        the same demand (within 5%: the order among them is a tie-break anyway) are split
        into rounds of flows that share no arc, and a round is scored in one array step."""
        pad = len(self.inv)
        bad = pad + 1  # fills missing candidates: infinitely loaded
        load = np.asarray(self.load + [0.0, np.inf])
        inv = np.asarray(self.inv + [0.0, 1.0])
        todo = [f for f in flows if len(self.var[f]) > 1]
        for f in flows:
            if len(self.var[f]) == 1:
                self.assign[f] = 0
                for a in self.var[f][0]:
                    load[a] += self.d[f]
        kmax = max((len(self.var[f]) for f in todo), default=1)
        lmax = max((len(p) for f in todo for p in self.var[f]), default=1) or 1
        # one padded (candidates x arcs) block per flow, built per shape at C speed
        P = np.full((len(todo), kmax, lmax), pad, dtype=np.intp)
        shapes: dict[tuple[int, int, bool], list[int]] = {}
        for i, f in enumerate(todo):
            lens = {len(p) for p in self.var[f]}
            shapes.setdefault((len(self.var[f]), max(lens), len(lens) == 1), []).append(i)
        for (ncand, width, even), members in shapes.items():
            rows = ([self.var[todo[i]] for i in members] if even else
                    [[p + (pad,) * (width - len(p)) for p in self.var[todo[i]]]
                     for i in members])
            block = np.array(rows, dtype=np.intp).reshape(len(members), ncand, width)
            P[members, :ncand, :width] = block
            P[members, ncand:, 0] = bad
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
        for f in flows:
            for a in self.var[f][self.assign[f]]:
                self.on[a].add(f)

    # -- local improvement ------------------------------------------------------------------
    def _relieve(self, a: int, limit: float, free: set[int],
                 journal: list[tuple[int, int]], depth: int,
                 busy: set[int]) -> bool:
        """Bring arc `a` below `limit` by moving flows off it, never leaving another arc at or
        above `limit`: a move that overloads up to two arcs recursively relieves them (an
        ejection chain, `depth` deep, within the shared work `budget`). Moves of flows in
        `free` are tried first; flows in `busy` are already moving in this chain."""
        inv, load = self.inv, self.load
        while load[a] * inv[a] >= limit:
            flows = sorted((f for f in self.on[a] if f not in busy),
                           key=lambda f: (f not in free, -self.d[f]))
            moved = False
            for f in flows[:12] if depth < 2 else flows:
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
                    mark = len(journal)
                    journal.append((f, cur))
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
                if moved:
                    break
            if not moved:
                return False
        return True

    def _undo(self, journal: list[tuple[int, int]], mark: int) -> None:
        while len(journal) > mark:
            f, k = journal.pop()
            self.lift(f)
            self.place(f, k)

    def improve(self, deadline: float, free: set[int] | None = None, depth: int = 3,
                target: float = 0.0) -> None:
        """Lower the maximum utilisation level by level until a level cannot be cleared, the
        maximum is at `target` or time runs out; a failed level is rolled back."""
        free = free if free is not None else set()
        while time.perf_counter() < deadline:
            u = self.util()
            top = max(u, default=0.0)
            if top <= max(self.fixed_util, target) + EPS or top <= EPS:
                return
            limit = top - max(EPS, top * 1e-9)
            hot = sorted((a for a, x in enumerate(u) if x >= limit), key=lambda a: -u[a])
            journal: list[tuple[int, int]] = []
            self.budget = 20000 + 50 * len(hot)
            for a in hot:
                if time.perf_counter() >= deadline or \
                        not self._relieve(a, limit, free, journal, depth, set()):
                    self._undo(journal, 0)
                    return
            free.update(f for f, _ in journal)


    def restore(self, prev: Sequence[int]) -> None:
        """Undo moves the final maximum does not need: a moved flow goes back to its previous
        path when that leaves every link at or below the maximum reached."""
        level = self.max_util() + EPS
        changed = True
        while changed:
            changed = False
            for f, k in enumerate(prev):
                cur = self.assign[f]
                if k < 0 or cur == k:
                    continue
                d, mine = self.d[f], self.var[f][cur]
                if all((self.load[a] + d) * self.inv[a] <= level
                       for a in self.var[f][k] if a not in mine):
                    self.lift(f)
                    self.place(f, k)
                    changed = True


def _result(inst: Instance, st: _State, prev: Sequence[int] | None, t0: float) -> Result:
    moved = [f for f, k in enumerate(st.assign) if prev is None or prev[f] != k]
    return Result(list(st.assign), st.max_util(), moved, time.perf_counter() - t0)


def plan(inst: Instance, current: Sequence[int] | None = None,
         budget_s: float = 0.5) -> Result:
    """A full plan. `current[f]`: the candidate flow f uses now (-1: unknown); `moved` counts
    flows whose path changes against it. Greedy from scratch (ties keep the current path),
    then improvement; when the flows' current paths are all known and that placement is no
    worse, improvement starts from it instead, so a plan is never worse than leaving the flows
    where they are, and moves only what lowers the maximum."""
    t0 = time.perf_counter()
    st = _State(inst)
    st.greedy(range(inst.flows), current)
    st.improve(t0 + budget_s)
    if current is not None:
        st.restore(current)
    best = _result(inst, st, current, t0)
    if current is not None and all(k >= 0 for k in current) and \
            max_util(inst, current) <= best.max_util + EPS:
        kept = replan(inst, current, max(0.0, t0 + budget_s - time.perf_counter()))
        if kept.max_util <= best.max_util + EPS:
            best = kept
    best.seconds = time.perf_counter() - t0
    return best


def replan(inst: Instance, prev: Sequence[int], budget_s: float = 0.1,
           target: float = 0.0) -> Result:
    """Re-plan from `prev` (per flow: candidate index, -1 where the old path is no longer
    usable or unknown): displaced flows are placed largest first, then improvement prefers
    moving them; every other flow moves only to lower the maximum utilisation, and not at all
    once it is at or below `target` (a re-plan after a failure restores the utilisation the
    plan had before it with the fewest moves; a full plan improves further)."""
    t0 = time.perf_counter()
    st = _State(inst)
    displaced = []
    for f, k in enumerate(prev):
        if 0 <= k < len(inst.cand[f]):
            st.place(f, k)
        else:
            displaced.append(f)
    st.greedy(displaced)
    st.improve(t0 + max(budget_s, 0.0), set(displaced), target=target)
    st.restore(prev)
    return _result(inst, st, prev, t0)


# -- bounds (HiGHS; benchmark and tests) ------------------------------------------------------
def _classes(inst: Instance, by_demand: bool) -> tuple[list[list[tuple[int, ...]]], list[float],
                                                       list[int]]:
    """Flows with the same candidate paths (and, for the MILP, the same demand) are one class:
    exact for the LP, and for the MILP the flows of a class are interchangeable."""
    idx: dict[tuple[tuple[tuple[int, ...], ...], float | None], int] = {}
    paths: list[list[tuple[int, ...]]] = []
    dem: list[float] = []
    count: list[int] = []
    for f, c in enumerate(inst.cand):
        key = (tuple(sorted(c)), float(inst.demand[f]) if by_demand else None)
        i = idx.get(key)
        if i is None:
            i = idx[key] = len(paths)
            paths.append(list(key[0]))
            dem.append(0.0)
            count.append(0)
        dem[i] += float(inst.demand[f])
        count[i] += 1
    return paths, dem, count


def _solve(inst: Instance, integral: bool, time_limit: float) -> tuple[float | None, str]:
    import highspy

    # HiGHS' absolute tolerances need values near 1: measure in units of the largest link
    scale = 1.0 / float(np.max(inst.cap))
    inst = Instance(inst.cap * scale, inst.demand * scale, inst.cand, inst.base * scale)
    paths, dem, count = _classes(inst, integral)
    n_arcs = len(inst.cap)
    cols_start, cols_index, cols_value = [0], [], []
    lower, upper, cost, integ = [], [], [], []
    # column z: sum-of-arc rows get -cap*z
    for a in range(n_arcs):
        cols_index.append(a)
        cols_value.append(-float(inst.cap[a]))
    cols_start.append(len(cols_index))
    lower.append(0.0)
    upper.append(highspy.kHighsInf)
    cost.append(1.0)
    integ.append(highspy.HighsVarType.kContinuous)
    for c, ps in enumerate(paths):
        unit = dem[c] / count[c] if integral else 1.0
        for p in ps:
            for a in sorted(set(p)):
                cols_index.append(a)
                cols_value.append(unit)
            cols_index.append(n_arcs + c)
            cols_value.append(1.0)
            cols_start.append(len(cols_index))
            lower.append(0.0)
            upper.append(float(count[c]) if integral else dem[c])
            cost.append(0.0)
            integ.append(highspy.HighsVarType.kInteger if integral
                         else highspy.HighsVarType.kContinuous)
    base = inst.base
    row_lo = [-highspy.kHighsInf] * n_arcs + [float(count[c]) if integral else dem[c]
                                             for c in range(len(paths))]
    row_hi = [-float(base[a]) for a in range(n_arcs)] + row_lo[n_arcs:]
    lp = highspy.HighsLp()
    lp.num_col_ = len(cost)
    lp.num_row_ = len(row_lo)
    lp.col_cost_ = np.array(cost)
    lp.col_lower_ = np.array(lower)
    lp.col_upper_ = np.array(upper)
    lp.row_lower_ = np.array(row_lo)
    lp.row_upper_ = np.array(row_hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(cols_start, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(cols_index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(cols_value)
    if integral:
        lp.integrality_ = integ
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("threads", 1)
    if integral:
        h.setOptionValue("mip_rel_gap", 1e-6)
    h.passModel(lp)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    if status != "Optimal":
        return None, status
    return float(h.getInfo().objective_function_value), status


def lp_bound(inst: Instance, time_limit: float = 60.0) -> float | None:
    """The LP relaxation's maximum utilisation: no plan over these candidates goes lower."""
    return _solve(inst, False, time_limit)[0]


def milp_optimum(inst: Instance, time_limit: float = 60.0) -> float | None:
    """The integral optimum, None when HiGHS does not prove it within `time_limit`."""
    return _solve(inst, True, time_limit)[0]


def min_moves(inst: Instance, prev: Sequence[int], level: float,
              time_limit: float = 10.0) -> int | None:
    """The fewest flows any assignment with maximum utilisation <= `level` must move away
    from `prev` (-1: displaced, counts as moved), or None when HiGHS does not prove it in
    time. The benchmark compares a re-plan's moves with this."""
    import highspy

    scale = 1.0 / float(np.max(inst.cap))
    cap, dem, base = (np.asarray(inst.cap * scale), np.asarray(inst.demand * scale),
                      np.asarray(inst.base * scale))
    n_arcs = len(cap)
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("threads", 1)
    rows: list[list[tuple[int, float]]] = [[] for _ in range(n_arcs)]
    col = 0
    lower, upper, cost = [], [], []
    flow_cols: list[list[int]] = []
    for f, paths in enumerate(inst.cand):
        mine = []
        for k, p in enumerate(paths):
            cost.append(0.0 if k == prev[f] else 1.0)
            lower.append(0.0)
            upper.append(1.0)
            for a in set(p):
                rows[a].append((col, float(dem[f])))
            mine.append(col)
            col += 1
        flow_cols.append(mine)
    h.addVars(col, np.array(lower), np.array(upper))
    h.changeColsCost(col, np.arange(col, dtype=np.int32), np.array(cost))
    h.changeColsIntegrality(col, np.arange(col, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * col))
    for cols in flow_cols:
        h.addRow(1.0, 1.0, len(cols), np.array(cols, dtype=np.int32), np.ones(len(cols)))
    for a, entries in enumerate(rows):
        if entries:
            idx = np.array([c for c, _ in entries], dtype=np.int32)
            val = np.array([v for _, v in entries])
            h.addRow(-highspy.kHighsInf, float(level * cap[a] - base[a]) + 1e-9, len(idx),
                     idx, val)
    h.run()
    if h.modelStatusToString(h.getModelStatus()) != "Optimal":
        return None
    return int(round(h.getInfo().objective_function_value))

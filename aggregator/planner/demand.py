"""What a flow would carry, from what it did carry (docs/planning.md, Demand).

A flow's measured rate is its demand only where nothing held it back. TCP and DCQCN flows are
elastic: on a full link each takes its share, so their rates say where they are placed, not
what they want, and a plan made from them finds nothing to gain (every full link is at 1.0)
or, from rates measured before and after a move, gains that vanish once applied (lab run U:
the same connections moved back and forth). A flow a full link holds back gets instead the
rate it would reach limited only by the links every path of it shares (its NICs): its max-min
fair share of those with every planned flow taken as elastic, as Hedera estimates demand
(Al-Fares et al., NSDI 2010). That does not depend on where the plan puts it or its
neighbours, so plans stop chasing their own effect.
"""
from __future__ import annotations

import math
from collections import deque
from itertools import chain
from typing import Sequence

import numpy as np

from .solver import Instance

FULL = 0.9  # a link at this utilisation or more holds its largest flows back
LARGEST = 0.8  # of the largest rate or the fair share on a full link: its bottlenecked flows


class Demand:
    """A flow's demand from the rates its reports measured: the largest of the last `window`
    (a reconnect's or a plan's stall lowers a rate, not the demand), leaving out a flow's
    first rate once there is another (a new connection's ramp-up). `noise` is what the
    measurement cannot tell apart: twice the standard error of the window's mean, and the
    whole demand while fewer than `window` rates back it (a young flow)."""

    __slots__ = ("rates", "seen")

    def __init__(self, window: int) -> None:
        self.rates: deque[float] = deque(maxlen=window)
        self.seen = 0

    def add(self, rate: float) -> float:
        self.seen += 1
        if self.seen == 2:
            self.rates.clear()
        self.rates.append(rate)
        return max(self.rates)

    def noise(self) -> float:
        n = len(self.rates)
        if n < (self.rates.maxlen or 1) or n < 2:
            return max(self.rates)
        mean = sum(self.rates) / n
        var = sum((x - mean) ** 2 for x in self.rates) / (n - 1)
        return 2.0 * math.sqrt(var / n)


def elastic(inst: Instance, current: Sequence[int], shared: Sequence[tuple[int, ...]],
            jobs: Sequence[str | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The demand to plan with, and which flows were held back. A flow is held back when
    its current path (known) crosses a link at `FULL` or more of its capacity on which it
    carries about the largest rate or its fair share (`LARGEST`); it gets its max-min fair
    share of the arcs all its candidates share, every planned flow taken as elastic there
    (what the unplanned ones leave). A collective runs at its slowest link's pace, so a flow
    of a job (`jobs[f]`) with a held-back flow is held back too when it runs at that pace or
    faster. Every other flow keeps its measured demand. `shared[f]`: the arcs all of flow f's candidates share
    (`solver.Engine.splits`)."""
    d = inst.demand
    n = len(d)
    if n == 0:
        return d, np.zeros(0, dtype=bool)
    cur = np.asarray(current, dtype=np.intp)
    # each flow on its current path, or on its shared arcs while that is unknown
    paths = [c[k] if k >= 0 else s for c, k, s in zip(inst.cand, cur.tolist(), shared)]
    lens = np.fromiter(map(len, paths), dtype=np.intp, count=n)
    owner = np.repeat(np.arange(n), lens)
    arc = np.fromiter(chain.from_iterable(paths), dtype=np.intp, count=int(lens.sum()))
    m = len(inst.cap)
    load = inst.base + np.bincount(arc, weights=d[owner], minlength=m)
    # a full link's bottlenecked flows carry its largest rate, which is at least its fair
    # share: as large as either (less `LARGEST`, the rates' noise) counts, so that two
    # equal flows measured 0.5 and 0.64 are both held back
    top = np.zeros(m)
    np.maximum.at(top, arc, d[owner])
    fair = inst.cap / np.maximum(np.bincount(arc, minlength=m), 1)
    hit = (cur[owner] >= 0) & (load[arc] >= FULL * inst.cap[arc]) & \
        (d[owner] >= LARGEST * np.minimum(top, fair)[arc])
    held = np.zeros(n, dtype=bool)
    held[owner[hit]] = True
    if not held.any():
        return d, held
    if jobs is not None:
        # its other connections wait for the held ones and look limited by the application;
        # planned at that pace, one placed beside a held flow fills the link once the job
        # speeds up, and the next plan moves another (lab run V: three plans)
        code: dict[str, int] = {}
        job = np.fromiter((-1 if j is None else code.setdefault(j, len(code)) for j in jobs),
                          dtype=np.intp, count=n)
        if code:
            # each job's pace: its slowest held flow (arrays: nearly every flow of a
            # 32,768-flow plan can be held)
            mine = held & (job >= 0)
            pace = np.full(len(code), np.inf)
            np.minimum.at(pace, job[mine], d[mine])
            at = np.where(job >= 0, pace[np.maximum(job, 0)], np.inf)
            held |= (cur >= 0) & (d >= LARGEST * at)
    # every planned flow shares its shared arcs as if elastic (Hedera): a held flow's estimate
    # must not follow its siblings' measured rates, which change with the plan (lab: a
    # sibling moved onto an emptier link ran at the ring's pace, left the held flow the rest
    # of the NIC, and the next plan moved that flow again)
    clen = np.fromiter(map(len, shared), dtype=np.intp, count=n)
    s_arc = np.fromiter(chain.from_iterable(shared), dtype=np.intp, count=int(clen.sum()))
    share = _fill(np.maximum(inst.cap - inst.base, 0.0), np.repeat(np.arange(n), clen), s_arc,
                  n)
    out = d.copy()
    ok = held & np.isfinite(share) & (share > 0)
    out[ok] = share[ok]
    return out, held


def _fill(cap: np.ndarray, owner: np.ndarray, arc: np.ndarray, n: int) -> np.ndarray:
    """Max-min fair rates of `n` flows, flow owner[i] crossing arc[i], by progressive filling:
    every unfrozen flow rises together until an arc fills, which freezes its flows. A flow
    that crosses no arc has no limit here: inf."""
    rate = np.zeros(n)
    frozen = np.zeros(n, dtype=bool)
    left = cap.astype(np.float64)
    while True:
        live = ~frozen[owner]
        if not live.any():
            break
        count = np.bincount(arc[live], minlength=len(cap))
        used = count > 0
        step = float(np.min(left[used] / count[used]))
        rate[~frozen] += step
        left[used] -= step * count[used]
        full = used & (left <= 1e-9 * np.maximum(cap, 1.0))
        frozen[owner[full[arc]]] = True
    rate[np.bincount(owner, minlength=n) == 0] = np.inf
    return rate

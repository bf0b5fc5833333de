"""Robust statistics for thousands of ranks without numpy."""
from __future__ import annotations

import math
from typing import Sequence


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty sequence."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(sorted(xs), 0.5)


def lower_baseline(xs: Sequence[float]) -> tuple[float, float]:
    """(center, sigma) of the healthy part of a sample that faults can only push *up*.

    A fault makes connections slower, never faster, and in a small job it can slow half of
    them: the median breaks down there. The lower quartile and the 5-25 % spread survive up
    to 75 % contamination from above (for a normal sample: q25 = mu - 0.674 sigma,
    q05 = mu - 1.645 sigma).
    """
    s = sorted(xs)
    q05, q25 = quantile(s, 0.05), quantile(s, 0.25)
    sigma = max((q25 - q05) / 0.971, 1e-9)
    return q25 + 0.674 * sigma, sigma

"""The small arithmetic of a benchmark round: percentiles and means that say nothing rather than divide by zero."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`th percentile (0-100) by linear interpolation between closest ranks (numpy's default): p50 of
    [1, 2, 3, 4] is 2.5, p95 of one value is that value. ValueError on no values or p outside 0-100."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0-100")
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def rate(count: float, seconds: float) -> float | None:
    """count per second; None for no time (nothing was measured, not infinitely fast)."""
    return count / seconds if seconds > 0 else None

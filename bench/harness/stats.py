"""Small statistics helpers (no numpy needed by the callers)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    fraction = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50.0)


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p99, mean, min and max of ``values`` (None where there is nothing)."""
    return {
        "n": len(values),
        "p50": percentile(values, 50.0),
        "p99": percentile(values, 99.0),
        "mean": sum(values) / len(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b

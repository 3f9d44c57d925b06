"""Small statistics over latency histograms and repeated runs."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

Histogram = Mapping[int, int]


def merge(histograms: Iterable[Histogram]) -> dict[int, int]:
    """Sum histograms bucket by bucket."""
    total: dict[int, int] = {}
    for hist in histograms:
        for bucket, count in hist.items():
            total[bucket] = total.get(bucket, 0) + count
    return total


def count(hist: Histogram) -> int:
    """Number of samples in ``hist``."""
    return sum(hist.values())


def percentile(hist: Histogram, q: float) -> float | None:
    """The ``q``-th percentile (0–100) in milliseconds; ``None`` for no samples."""
    total = count(hist)
    if not total:
        return None
    rank = max(1, round(q / 100 * total))
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return bucket / 1000
    return max(hist) / 1000


def cdf(hist: Histogram) -> tuple[list[float], list[float]]:
    """(milliseconds, cumulative share) points of ``hist``, for plotting."""
    total = count(hist)
    xs: list[float] = []
    ys: list[float] = []
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        xs.append(bucket / 1000)
        ys.append(seen / total)
    return xs, ys


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Median, min and max of the values that exist; ``None`` if none do."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {
        "median": statistics.median(present),
        "min": min(present),
        "max": max(present),
        "n": len(present),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or zero."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator

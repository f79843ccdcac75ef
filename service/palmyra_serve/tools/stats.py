"""Small statistics for bench and validate: percentiles, summaries, scaling efficiency.

Pure Python on purpose: the tools import nothing heavy until they need it, and these are tested
without numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """n, mean, min, max and p50/p90/p99 of a sample; NaN fields for an empty one."""
    vals = [float(v) for v in values]
    out: dict[str, float | int] = {"n": len(vals)}
    out["mean"] = sum(vals) / len(vals) if vals else math.nan
    out["min"] = min(vals) if vals else math.nan
    out["max"] = max(vals) if vals else math.nan
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(vals, q)
    return out


def scaling(throughput_by_concurrency: dict[int, float]) -> dict[int, dict[str, float]]:
    """Speed-up against one stream and efficiency against the ideal (speed-up == concurrency).

    the reference adaptation's 14.05x at 16 streams is 14.05 / 16 = 87.8% efficiency. Without a measurement
    at concurrency 1 the lowest measured concurrency is the base, scaled as if it were ideal.
    """
    if not throughput_by_concurrency:
        return {}
    base_c = min(throughput_by_concurrency)
    base = throughput_by_concurrency[base_c] / base_c
    out = {}
    for c, thr in sorted(throughput_by_concurrency.items()):
        speedup = thr / base if base > 0 else math.nan
        out[c] = {"speedup": speedup, "efficiency": speedup / c}
    return out

"""The latency summaries `bench_pool_scale.py` prints: how many samples, the nearest-rank p50 and p99 and the
maximum, in seconds rounded to the millisecond (None without samples)."""

from __future__ import annotations

from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "p50_s": percentile(values, 0.5),
        "p99_s": percentile(values, 0.99),
        "max_s": None if not values else round(max(values), 3),
    }

"""Small helpers to build metric families with fixed label names (prometheus_client's core types)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "perseus_"


def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


def counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    """A counter; `name` has no `_total` (the library appends it to the sample)."""
    return CounterMetricFamily(PREFIX + name, doc, labels=list(labels))


def mhz_to_hz(clock_mhz: float) -> float:
    return clock_mhz * 1e6

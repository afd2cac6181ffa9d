"""Small helpers to build metric families with fixed label names (prometheus_client's core types)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "perseus_"
_F = TypeVar("_F", GaugeMetricFamily, CounterMetricFamily)


def gauge(
    name: str, doc: str, labels: Sequence[str] = (), *, value: float | None = None
) -> GaugeMetricFamily:
    """A gauge; with `value`, a family without labels holding that one sample."""
    return _family(GaugeMetricFamily, name, doc, labels, value)


def counter(
    name: str, doc: str, labels: Sequence[str] = (), *, value: float | None = None
) -> CounterMetricFamily:
    """A counter; `name` has no `_total` (the library appends it to the sample). `value` as for `gauge`."""
    return _family(CounterMetricFamily, name, doc, labels, value)


def _family(kind: type[_F], name: str, doc: str, labels: Sequence[str], value: float | None) -> _F:
    family = kind(PREFIX + name, doc, labels=list(labels))
    if value is not None:
        family.add_metric([], value)
    return family


def mhz_to_hz(clock_mhz: float) -> float:
    return clock_mhz * 1e6

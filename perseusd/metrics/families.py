"""Small helpers to build metric families with fixed label names (prometheus_client's core types)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
    add_known(family, [], value)
    return family


def add_known(
    family: GaugeMetricFamily | CounterMetricFamily, labels: Sequence[str], value: float | None
) -> None:
    """A sample of `value` labelled `labels`, when it is known: an unknown value is left out, never 0."""
    if value is not None:
        family.add_metric(labels, value)


def add_state_set(
    family: GaugeMetricFamily, labels: Sequence[str], states: Iterable[str], current: str | None
) -> None:
    """A state set: one sample per state, labelled `labels` and the state, 1 for `current` and 0 for the
    others (the state is the family's last label)."""
    for name in states:
        family.add_metric([*labels, name], 1.0 if current == name else 0.0)


def mhz_to_hz(clock_mhz: float) -> float:
    return clock_mhz * 1e6

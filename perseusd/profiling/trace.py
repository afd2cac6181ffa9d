"""What online profiling records on one GPU: computation intervals and energy counter samples.

The daemon reads a GPU's cumulative energy counter every ~10 ms, but the counter itself only changes every
20-100 ms. A sample whose value did not change carries no information (it only says "no update yet"), so a
`CounterTrace` keeps the first sample and then only the samples at which the value changed. Each kept sample
after the first is read just after an update, so its value is the energy up to (about) its read time; the
first sample's value may be up to one update period old, which the estimator accounts for.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

OptionKey = tuple[int, str]
"""(profile stage = virtual stage, instruction: an `Instruction` value): what one computation runs."""

_TRIM_FRACTION = 10
"""A full trace drops its oldest 1/_TRIM_FRACTION at once, so that trimming costs O(1) per sample."""


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One read of a GPU's cumulative energy counter."""

    t_ns: int
    """CLOCK_MONOTONIC time of the read (ns)."""
    energy_mj: int
    """The counter's value (mJ)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """One computation on one GPU: which option it ran, at which clock, and when (CLOCK_MONOTONIC ns)."""

    key: OptionKey
    clock_mhz: int
    start_ns: int
    end_ns: int


class CounterTrace:
    """One GPU's counter samples; keeps the first sample and then only samples whose value changed.

    Memory is bounded: with more than `max_samples` kept samples, the oldest tenth is dropped. Samples must
    come in time order; one older than the last kept sample is ignored. Not thread-safe (one owner).
    """

    def __init__(self, max_samples: int = 200_000) -> None:
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2 (got {max_samples})")
        self._max_samples = max_samples
        self._t_ns: list[int] = []
        self._energy_mj: list[int] = []

    def add(self, t_ns: int, energy_mj: int) -> bool:
        """Record one read of the counter; True when it was kept (the first read or a changed value)."""
        if self._t_ns and (t_ns < self._t_ns[-1] or energy_mj == self._energy_mj[-1]):
            return False
        self._t_ns.append(t_ns)
        self._energy_mj.append(energy_mj)
        if len(self._t_ns) > self._max_samples:
            drop = max(1, self._max_samples // _TRIM_FRACTION)
            del self._t_ns[:drop]
            del self._energy_mj[:drop]
        return True

    def samples(self, since_ns: int = 0) -> list[CounterSample]:
        """The kept samples read at or after `since_ns`, oldest first."""
        first = bisect.bisect_left(self._t_ns, since_ns)
        return [CounterSample(t, e) for t, e in zip(self._t_ns[first:], self._energy_mj[first:], strict=True)]

    def energy_j(self, start_ns: int, end_ns: int) -> float | None:
        """Energy (J) used between two times, interpolating linearly between kept samples.

        None when the kept samples do not cover [start_ns, end_ns] or when end_ns < start_ns.
        """
        if end_ns < start_ns or not self._t_ns or start_ns < self._t_ns[0] or end_ns > self._t_ns[-1]:
            return None
        return (self._energy_at_mj(end_ns) - self._energy_at_mj(start_ns)) / 1000.0

    def _energy_at_mj(self, t_ns: int) -> float:
        """The counter at `t_ns` (mJ), which lies within the kept samples' span."""
        right = bisect.bisect_left(self._t_ns, t_ns)
        if self._t_ns[right] == t_ns:
            return float(self._energy_mj[right])
        t0_ns, t1_ns = self._t_ns[right - 1], self._t_ns[right]
        e0_mj, e1_mj = self._energy_mj[right - 1], self._energy_mj[right]
        return e0_mj + (e1_mj - e0_mj) * (t_ns - t0_ns) / (t1_ns - t0_ns)

    def __len__(self) -> int:
        return len(self._t_ns)

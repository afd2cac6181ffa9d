"""Energy from the GPUs' energy counters, accurate despite their coarse updates.

A GPU's energy counter (NVML's, and the simulated one that mimics it) changes only once per update period
(100 ms): a single read can be up to a period's energy stale. The simulated counter publishes the exact energy
at the first read after each period boundary, so a sample polls the counters until each GPU's value changes
and records the moment of that read: value and time then agree. Energy between two samples is exact up to the
counter's noise; power is that energy over the span between the samples, and a phase's energy per iteration is
its power times its mean iteration time (the span need not hold a whole number of iterations).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

POLL_INTERVAL_S = 0.003
"""Between two counter reads while waiting for a change: the sample's time is this accurate."""
SAMPLE_TIMEOUT_S = 5.0
"""A counter that does not change for this long is broken (the period is 100 ms)."""

CounterReader = Callable[[], Mapping[str, float | None]]
"""Reads every GPU's energy counter (J) at once; None for a GPU without one."""


class CounterError(Exception):
    """A GPU's energy counter is missing or does not change."""


@dataclass(frozen=True)
class CounterSample:
    """Each GPU's counter value (J) right after it changed, and when (s, CLOCK_MONOTONIC)."""

    energy_j: Mapping[str, float]
    time_s: Mapping[str, float]

    @property
    def total_j(self) -> float:
        return sum(self.energy_j.values())

    @property
    def mean_time_s(self) -> float:
        return sum(self.time_s.values()) / len(self.time_s)


@dataclass(frozen=True)
class EnergyWindow:
    """The energy the GPUs drew between two samples (J), and their summed average power over it (W)."""

    energy_j: float
    power_w: float
    duration_s: float


class CounterSampler:
    """Takes counter samples of a fixed set of GPUs.

    Args:
        read: reads the counters (e.g. from the daemon's status reply).
        gpus: the GPUs to sample.
        clock, sleep: time source (CLOCK_MONOTONIC, shared with the simulated GPUs) and sleep function.
    """

    def __init__(
        self,
        read: CounterReader,
        gpus: Sequence[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = POLL_INTERVAL_S,
        timeout_s: float = SAMPLE_TIMEOUT_S,
    ) -> None:
        if not gpus:
            raise ValueError("no GPUs to sample")
        self._read = read
        self._gpus = tuple(gpus)
        self._clock = clock
        self._sleep = sleep
        self._poll_interval_s = poll_interval_s
        self._timeout_s = timeout_s

    def sample(self) -> CounterSample:
        """Poll until every GPU's counter changed once; each value with the time of the read that saw it."""
        before, _ = self._timed_read()
        energy_j: dict[str, float] = {}
        time_s: dict[str, float] = {}
        deadline_s = self._clock() + self._timeout_s
        while len(energy_j) < len(self._gpus):
            if self._clock() > deadline_s:
                stuck = ", ".join(gpu for gpu in self._gpus if gpu not in energy_j)
                raise CounterError(f"energy counter did not change within {self._timeout_s:g} s: {stuck}")
            self._sleep(self._poll_interval_s)
            values, read_s = self._timed_read()
            for gpu in self._gpus:
                if gpu not in energy_j and values[gpu] != before[gpu]:
                    energy_j[gpu], time_s[gpu] = values[gpu], read_s
        return CounterSample(energy_j, time_s)

    def _timed_read(self) -> tuple[dict[str, float], float]:
        """The counters and the middle of the read (each counter publishes during the read)."""
        start_s = self._clock()
        raw = self._read()
        read_s = (start_s + self._clock()) / 2
        values: dict[str, float] = {}
        for gpu in self._gpus:
            value = raw.get(gpu)
            if value is None:
                raise CounterError(f"GPU {gpu} has no energy counter")
            values[gpu] = value
        return values, read_s


def window(start: CounterSample, end: CounterSample, gpus: Sequence[str] | None = None) -> EnergyWindow:
    """Energy and average power between two samples of the same GPUs (each GPU over its own span), of all
    their GPUs or of `gpus` only (e.g. one pipeline's)."""
    energy_j = 0.0
    power_w = 0.0
    for gpu in end.energy_j if gpus is None else gpus:
        end_j = end.energy_j[gpu]
        span_s = end.time_s[gpu] - start.time_s[gpu]
        if span_s <= 0:
            raise ValueError("samples out of order")
        energy_j += end_j - start.energy_j[gpu]
        power_w += (end_j - start.energy_j[gpu]) / span_s
    return EnergyWindow(energy_j, power_w, end.mean_time_s - start.mean_time_s)

"""Measured energy per iteration, from the GPUs' energy counters (not from the profile).

A counter moves only every 20-100 ms. The energy sampler keeps the first read and then only the reads at
which the value changed (`CounterTrace`), each just after an update; the first read's value may be an update
old. So the mean power over a span is the energy between the first and the last update seen after the first
read, divided by the time between them; times an iteration's measured duration, it is the energy of one
iteration. Two such figures are kept per GPU: at all-max clocks (profiling starts at the highest clock, after
the warm-up iterations) and while the plan runs. Only what the counters measured is reported as measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.profiling.trace import CounterSample

MIN_SPAN_S = 0.5
"""The shortest span between counter updates that gives a power, when the counter is read every 10 ms (each
kept read is within 10 ms of its update): a 100 ms counter updates 5 times."""
SLOW_READS_MIN_SPAN_S = 5.0
"""The same when the counter is read once a second (a read sees an update up to 100 ms old): within ~2 %."""


def counter_power_w(samples: Sequence[CounterSample], min_span_s: float = MIN_SPAN_S) -> float | None:
    """Mean power (W) between the first and the last counter update after the first read; None when the
    updates span less than `min_span_s` (or the counter went backwards)."""
    updates = samples[1:]
    if len(updates) < 2:
        return None
    span_s = (updates[-1].t_ns - updates[0].t_ns) / 1e9
    energy_j = (updates[-1].energy_mj - updates[0].energy_mj) / 1000.0
    if span_s < min_span_s or energy_j < 0:
        return None
    return energy_j / span_s


def iteration_energy_j(
    samples: Sequence[CounterSample], iteration_s: float | None, min_span_s: float = MIN_SPAN_S
) -> float | None:
    """One iteration's measured energy on one GPU (J): its mean counter power times its iteration time."""
    power_w = counter_power_w(samples, min_span_s)
    if power_w is None or iteration_s is None or iteration_s <= 0:
        return None
    return power_w * iteration_s


@dataclass(frozen=True)
class MeasuredSaving:
    """A job's measured energy per iteration (all its GPUs on this node), running and at all-max clocks."""

    running_j: float
    all_max_j: float | None
    iterations: float

    @property
    def saved_j(self) -> float | None:
        """Energy saved against all-max over the iterations run (None without a measured all-max)."""
        return None if self.all_max_j is None else (self.all_max_j - self.running_j) * self.iterations


def job_measurement(
    per_gpu: Sequence[tuple[float | None, float | None]], iterations: float
) -> MeasuredSaving | None:
    """The job's measured figures from each GPU's (running J, all-max J) per iteration; None unless every
    GPU's running energy is measured; all-max only when every GPU's is."""
    if not per_gpu or any(running is None for running, _ in per_gpu):
        return None
    running_j = sum(running for running, _ in per_gpu if running is not None)
    all_max = [a for _, a in per_gpu if a is not None]
    all_max_j = sum(all_max) if len(all_max) == len(per_gpu) else None
    return MeasuredSaving(running_j, all_max_j, iterations)

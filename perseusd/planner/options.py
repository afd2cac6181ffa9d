"""Execution options of one (stage, instruction): the Pareto-filtered, time-quantised profile rows.

Follows section 3 of the solver specification: quantise with floating-point floor division, keep the Pareto
front of (time, energy), keep the fastest option of each time bucket, fall back to a 0.95 noise factor when
three or fewer options survive, and subtract the blocking power from each survivor's energy (after the
filter) to get its effective cost.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.errors import PlanningError
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement

NOISE_FACTOR = 1.0
FALLBACK_NOISE_FACTOR = 0.95
MIN_OPTIONS_BEFORE_FALLBACK = 3


@dataclass(frozen=True)
class Option:
    """One candidate way to run a computation: a clock with its measured and quantised time and its cost."""

    freq_mhz: int
    time_s: float
    energy_j: float
    quant_time: int
    effective_cost_j: float
    """energy_j - P_block * quant_time * unit_time_s: the cost the solver minimises."""


@dataclass(frozen=True)
class OptionSet:
    """The candidate options of one (stage, instruction), slowest (largest quant_time) first."""

    stage: int
    instruction: Instruction
    options: tuple[Option, ...]

    @property
    def min_quant(self) -> int:
        """The fastest quantised duration."""
        return self.options[-1].quant_time

    @property
    def max_quant(self) -> int:
        """The slowest quantised duration."""
        return self.options[0].quant_time

    def option_for(self, quant_time: int) -> Option:
        """The slowest option that still fits in `quant_time` (the fastest one if none fits)."""
        for option in self.options:
            if option.quant_time <= quant_time:
                return option
        return self.options[-1]


def quantise(time_s: float, unit_time_s: float) -> int:
    """Quantised time: floating-point floor division, as the reference does (0.051 // 0.001 == 50)."""
    return int(time_s // unit_time_s)


def _dominated(rows: Sequence[Measurement], noise: float) -> list[bool]:
    """Per row: whether another row is faster and cheaper, each by the factor `noise`.

    Some o has o.time < t and o.energy < e exactly when the least energy of the rows faster than t is
    below e: with the rows sorted by time and a running minimum of energy, one binary search per row.
    """
    if not all(math.isfinite(m.time_s) and math.isfinite(m.energy_j) for m in rows):  # no order: compare all
        return [
            any(o.time_s < m.time_s * noise and o.energy_j < m.energy_j * noise for o in rows) for m in rows
        ]
    fastest_first = sorted(rows, key=lambda m: m.time_s)
    times_s = [m.time_s for m in fastest_first]
    least_energy_j = list(itertools.accumulate((m.energy_j for m in fastest_first), min))
    dominated = []
    for m in rows:
        faster = bisect.bisect_left(times_s, m.time_s * noise)  # rows with time < m.time_s * noise
        dominated.append(faster > 0 and least_energy_j[faster - 1] < m.energy_j * noise)
    return dominated


def _pareto_filter(rows: Sequence[Measurement], unit_time_s: float, noise: float) -> list[Measurement]:
    by_time = sorted(rows, key=lambda m: m.time_s, reverse=True)
    front = [m for m, dominated in zip(by_time, _dominated(by_time, noise), strict=True) if not dominated]
    front.sort(key=lambda m: m.energy_j, reverse=True)
    seen: set[int] = set()
    kept: list[Measurement] = []
    for m in front:
        q = quantise(m.time_s, unit_time_s)
        if q not in seen:
            seen.add(q)
            kept.append(m)
    kept.sort(key=lambda m: quantise(m.time_s, unit_time_s), reverse=True)
    return kept


def build_option_set(
    stage: int,
    instruction: Instruction,
    rows: Sequence[Measurement],
    unit_time_s: float,
    p_block_w: float,
) -> OptionSet:
    """Filter one (stage, instruction)'s measurements into candidate options with effective costs."""
    if not rows:
        raise PlanningError(f"stage {stage} {instruction.value}: no measurements")
    if not unit_time_s > 0:
        raise PlanningError(f"unit time must be positive (got {unit_time_s})")
    kept = _pareto_filter(rows, unit_time_s, NOISE_FACTOR)
    if len(kept) <= MIN_OPTIONS_BEFORE_FALLBACK:
        kept = _pareto_filter(rows, unit_time_s, FALLBACK_NOISE_FACTOR)
    options = []
    for m in kept:
        q = quantise(m.time_s, unit_time_s)
        options.append(Option(m.freq_mhz, m.time_s, m.energy_j, q, m.energy_j - p_block_w * q * unit_time_s))
    if options[-1].quant_time < 1:
        raise PlanningError(
            f"stage {stage} {instruction.value}: the fastest time ({options[-1].time_s:g}) is below one unit "
            f"time ({unit_time_s:g}); choose a smaller --unit-time (in the profile's time unit)"
        )
    return OptionSet(stage, instruction, tuple(options))

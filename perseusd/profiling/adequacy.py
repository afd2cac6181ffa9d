"""Can a measured profile support a plan? The reasons it cannot, in words a user can act on.

A frequency plan trades time for energy along each computation's clock curve. A profile whose energies do
not move with the clock, whose times do not follow it, or with too few clocks has no such curve: solving it
gives a flat frontier of meaningless points (on simulated GPUs that no workload drives, a real PyTorch job
"profiled" at 0 J and deployed a flat 15-point frontier). Such a job is never deployed; these checks say
why. They are deliberately loose: a real GPU's curves move by tens of percent (an H100 stage: -22 % energy
and +38 % time from 1980 to 1080 MHz), noise by a few.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile

MIN_CLOCKS = 3
"""Clocks a (stage, instruction) needs for a curve (the highest, the lowest and one between)."""
MIN_ENERGY_RANGE = 0.02
"""The least (max - min) / max of a curve's energies that counts as moving with the clock."""
MIN_TIME_RISE = 0.02
"""The least rise of the time from the highest to the lowest clock that counts as following the clock."""


@dataclass(frozen=True)
class CurveFacts:
    """What one (stage, instruction)'s measurements show."""

    stage: int
    instruction: Instruction
    clocks: int
    energy_range: float
    """(max - min) / max of its energies (0 when every energy is 0)."""
    time_rise: float
    """time at its lowest clock / time at its highest clock - 1."""
    zero_energy: bool


def curve_facts(stage: int, instruction: Instruction, options: Sequence[Measurement]) -> CurveFacts:
    """The facts of one (stage, instruction)'s measurements (at least one)."""
    by_clock = sorted(options, key=lambda m: m.freq_mhz)
    energies_j = [m.energy_j for m in by_clock]
    top_j = max(energies_j)
    energy_range = (top_j - min(energies_j)) / top_j if top_j > 0 else 0.0
    highest_s = by_clock[-1].time_s
    time_rise = by_clock[0].time_s / highest_s - 1.0 if highest_s > 0 else 0.0
    return CurveFacts(
        stage,
        instruction,
        len({m.freq_mhz for m in by_clock}),
        energy_range,
        time_rise,
        zero_energy=top_j <= 0,
    )


def profile_facts(profile: Profile) -> list[CurveFacts]:
    keys = sorted({(m.stage, m.instruction) for m in profile.measurements}, key=lambda k: (k[0], k[1].value))
    return [
        curve_facts(stage, instruction, profile.options(stage, instruction)) for stage, instruction in keys
    ]


def plan_problems(profile: Profile, counted_energy_j: float | None = None) -> list[str]:
    """Why `profile` cannot support a plan (empty: it can).

    Args:
        profile: the measured profile.
        counted_energy_j: the energy the GPUs' counters moved by while the job profiled (None: not known).
    """
    facts = profile_facts(profile)
    if not facts:
        return ["nothing was measured"]
    problems: list[str] = []
    if counted_energy_j is not None and counted_energy_j <= 0:
        problems.append(
            "the GPUs' energy counters did not move while the job profiled (0 J): nothing drives these GPUs "
            "(on simulated GPUs a job must drive the simulated workload, see docs/jobs.md)"
        )
    elif all(f.zero_energy for f in facts):
        problems.append("every computation measured 0 J")
    most_clocks = max(f.clocks for f in facts)
    if most_clocks < MIN_CLOCKS:
        problems.append(f"too few clocks: at most {most_clocks} per computation (a plan needs {MIN_CLOCKS})")
        return problems
    widest = max(f.energy_range for f in facts)
    if widest < MIN_ENERGY_RANGE:
        problems.append(
            f"energy does not move with the clock: at most {100 * widest:.1f} % across the clocks measured "
            f"(a plan needs {100 * MIN_ENERGY_RANGE:g} %)"
        )
    steepest = max(f.time_rise for f in facts)
    if steepest < MIN_TIME_RISE:
        problems.append(
            f"times do not follow the clock: the lowest clock is at most {100 * steepest:+.1f} % slower than "
            f"the highest (a plan needs +{100 * MIN_TIME_RISE:g} %)"
        )
    return problems

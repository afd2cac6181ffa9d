"""Synthetic but physically shaped profiles for tests: imbalanced stages, plateaus, few clocks."""

from __future__ import annotations

import random
from dataclasses import dataclass

from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile

A100_CLOCKS_MHZ = tuple(range(1410, 850, -45))
"""An A100's SM clocks from 1410 MHz down in 45 MHz steps: the clocks unit tests profile at."""


@dataclass(frozen=True)
class Point:
    """A frontier point made by hand: the fields a plan is made from (`perseusd.planner.plan.PlanPoint`),
    without a solver."""

    quant_time: int
    time_s: float
    model_energy_j: float
    refined_energy_j: float
    clocks_mhz: tuple[int, ...]


def synthetic_profile(
    num_stages: int,
    seed: int,
    *,
    clocks_mhz: tuple[int, ...] = tuple(range(1410, 885, -45)),
    base_time_s: float = 0.02,
    imbalance: float = 0.4,
    plateau: bool = False,
) -> Profile:
    """Time falls with the clock (saturating above a knee when `plateau`), power rises superlinearly.

    Stage weights are drawn in [1, 1 + imbalance] with heavier first and last stages.
    """
    rng = random.Random(seed)
    f_max = max(clocks_mhz)
    rows = []
    for stage in range(num_stages):
        edge = 1.0 + (imbalance if stage in (0, num_stages - 1) else 0.0)
        weight = edge * (1.0 + rng.uniform(0.0, imbalance))
        knee = rng.uniform(0.75, 0.9) * f_max if plateau else f_max
        for instruction, factor in (
            (Instruction.FORWARD, 1.0),
            (Instruction.BACKWARD, rng.uniform(1.8, 2.2)),
        ):
            alpha = rng.uniform(0.6, 0.95)
            p_static, p_dyn = rng.uniform(60, 90), rng.uniform(180, 260)
            for f in clocks_mhz:
                ratio = min(f, knee) / f_max
                time_s = base_time_s * weight * factor * ratio**-alpha * rng.uniform(0.995, 1.005)
                power_w = p_static + p_dyn * (f / f_max) ** 2.5
                rows.append(Measurement(stage, instruction, f, time_s, time_s * power_w))
    return Profile.from_measurements(rows, f"synthetic-{seed}")

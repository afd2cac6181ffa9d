"""Small deterministic profiles for the planner-periphery tests (profile CSV, plans, baselines, CLI).

Time falls strictly with the clock (t = w * f_max / f); power is 150 W + 200 W * (f / f_max)^3, so energy per
execution is convex in the clock with its minimum near 0.72 f_max (1020 MHz), as on real GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile

CLOCKS_MHZ: tuple[int, ...] = (1410, 1320, 1230, 1140, 1050, 960, 870)


def shaped_profile(
    weights: Sequence[float],
    clocks_mhz: Sequence[int] = CLOCKS_MHZ,
    base_time_s: float = 0.02,
    backward_factor: float = 2.0,
    source: str = "shaped",
) -> Profile:
    """One stage per weight: forward time `base_time_s * weight` at the highest clock, backward twice that."""
    f_max = max(clocks_mhz)
    rows = []
    for stage, weight in enumerate(weights):
        for instruction, factor in ((Instruction.FORWARD, 1.0), (Instruction.BACKWARD, backward_factor)):
            for f in clocks_mhz:
                time_s = base_time_s * weight * factor * f_max / f
                power_w = 150.0 + 200.0 * (f / f_max) ** 3
                rows.append(Measurement(stage, instruction, f, time_s, time_s * power_w))
    return Profile.from_measurements(rows, source)

"""A pipeline built around one real stage: every stage's costs from that stage's own measured clock sweep.

A hybrid run (`perseus-emulate --real-stage K` on a `--backend mixed` daemon) runs one stage on a real GPU and
the others on simulated boards. The simulated stages need costs that belong to the same job, so they are the
real stage's own locked-clock sweep (its forward and backward, time and energy at each swept clock), scaled
in time and energy alike (power per clock unchanged) by a stated weight per pipeline position:

    stage s costs = sweep x weights[s] / weights[K]

With the default weights (1.0, 1.25, 1.0, 0.9) over four stages the pipeline is unbalanced the same way
whatever the real stage's position: stage 1 is the heaviest (on the critical path), stage 3 the lightest.
The real stage at position 0 or 3 is off the critical path; at position 1 it is the critical stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile

DEFAULT_WEIGHTS = (1.0, 1.25, 1.0, 0.9)


@dataclass(frozen=True)
class SweepRow:
    """One stage at one locked clock: per execution of its forward and of its backward."""

    clock_mhz: int
    forward_s: float
    forward_j: float
    backward_s: float
    backward_j: float

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> SweepRow:
        return cls(
            int(row["clock_mhz"]),
            float(row["forward_s"]),
            float(row["forward_j"]),
            float(row["backward_s"]),
            float(row["backward_j"]),
        )


def critical_stage(weights: Sequence[float]) -> int:
    """The heaviest stage: the one whose computations set a 1F1B pipeline's pace."""
    return max(range(len(weights)), key=lambda s: weights[s])


def pipeline_profile(
    sweep: Sequence[SweepRow], real_stage: int, weights: Sequence[float] = DEFAULT_WEIGHTS, source: str = ""
) -> Profile:
    """Every stage's costs from `sweep`, the real stage's, scaled by `weights[s] / weights[real_stage]`."""
    if not sweep:
        raise ValueError("an empty sweep")
    if not 0 <= real_stage < len(weights):
        raise ValueError(f"real stage {real_stage} is not one of the {len(weights)} stages")
    if any(not w > 0 for w in weights):
        raise ValueError("stage weights must be positive")
    rows = []
    for stage, weight in enumerate(weights):
        factor = weight / weights[real_stage]
        for row in sweep:
            rows.append(
                Measurement(
                    stage, Instruction.FORWARD, row.clock_mhz, row.forward_s * factor, row.forward_j * factor
                )
            )
            rows.append(
                Measurement(
                    stage,
                    Instruction.BACKWARD,
                    row.clock_mhz,
                    row.backward_s * factor,
                    row.backward_j * factor,
                )
            )
    name = source or f"hybrid:real-stage-{real_stage}:weights-{'/'.join(f'{w:g}' for w in weights)}"
    return Profile.from_measurements(rows, name)

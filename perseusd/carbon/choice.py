"""Which frontier point a carbon-aware job runs for the next interval: Chase's cost on the frontier.

Chase (arXiv 2303.02508) weighs the carbon of the energy an iteration uses against the time it takes, the
time priced at a reference: cost = eta * CI * E + (1 - eta) * CI_ref * P_ref * T, with CI the (forecast)
carbon intensity of the interval, E and T one iteration's energy and time, CI_ref the reference intensity
(Chase: the highest of the trace) and P_ref the reference power (the job's GPUs times their maximum power
limit). eta = 0 is "fastest", eta = 1 "least carbon"; Chase uses 0.24. The same cost works for a price per
kWh in place of carbon intensity.

The choice is made among the points the caller allows (`allowed_points`: those no slower than the job's
allowed slowdown; an admin power cap may filter them further before the choice), so it never decides how
slow a job may run, only where within its limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.planner.policy import TOLERANCE, PointSummary

DEFAULT_ETA = 0.24


@dataclass(frozen=True)
class ChaseWeights:
    """The cost's constants: eta, the reference intensity (gCO2eq/kWh or price) and reference power (W)."""

    eta: float
    reference_intensity: float
    reference_power_w: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta must be within [0, 1] (got {self.eta})")
        if self.reference_intensity < 0 or self.reference_power_w < 0:
            raise ValueError("the reference intensity and power must be >= 0")


def chase_cost(time_s: float, energy_j: float, intensity: float, weights: ChaseWeights) -> float:
    """Chase's cost of one iteration (J x intensity; only comparisons between points mean anything)."""
    return weights.eta * intensity * energy_j + (1.0 - weights.eta) * (
        weights.reference_intensity * weights.reference_power_w * time_s
    )


def allowed_points(points: Sequence[PointSummary], limit_s: float) -> list[PointSummary]:
    """The points no slower than `limit_s` (the fastest alone when none is: a job never stops)."""
    fitting = [p for p in points if p.time_s <= limit_s * (1 + TOLERANCE)]
    if fitting or not points:
        return fitting
    return [min(points, key=lambda p: (p.time_s, p.energy_j))]


def choose_point(allowed: Sequence[PointSummary], intensity: float, weights: ChaseWeights) -> PointSummary:
    """The allowed point of least Chase cost at `intensity` (the faster one on ties); `allowed` not empty."""
    if not allowed:
        raise ValueError("no frontier point to choose from")
    return min(allowed, key=lambda p: (chase_cost(p.time_s, p.energy_j, intensity, weights), p.time_s))

"""Straggler accounting (see `shared/docs/reference-numbers.md`), for any planner's set of points.

Without a straggler a planner runs its fastest point. With a straggler of factor k, every pipeline waits
until T' = k * T, where T is the no-straggler iteration time (here: the all-max time, the same T' for every
planner), drawing the blocking power P_block on each of its S GPUs meanwhile. A planner that can use the
slack runs its point with T_plan <= T' of minimum energy E_plan + S * P_block * (T' - T_plan), the energy
actually spent until T' (choosing by E_plan alone can pick a faster point and then pay for waiting); one
that cannot (EnvPipe) keeps its single plan and just waits. A plan slower than T' makes the iteration
T_plan long and has nothing to wait for. Savings and slowdowns are relative to all-max under the same
straggler (all-max waits until T' too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from perseusd.errors import PlanningError

STRAGGLER_FACTORS: tuple[float, ...] = (1.05, 1.1, 1.2, 1.5)
"""The straggler factors of the published comparison."""

NO_STRAGGLER = "none"
"""The key of the no-straggler case in comparison tables."""


class TimedPoint(Protocol):
    """Anything with a measured iteration time and energy (a baseline's `CandidatePoint`, ...)."""

    @property
    def time_s(self) -> float: ...
    @property
    def energy_j(self) -> float: ...


@dataclass(frozen=True)
class PointSet:
    """A planner's points and whether it can move to a slower point when a straggler gives it slack.

    `no_straggler` is the point it runs without a straggler (None: its fastest point).
    """

    points: tuple[TimedPoint, ...]
    uses_slack: bool = True
    no_straggler: TimedPoint | None = None


@dataclass(frozen=True)
class StragglerOutcome:
    """What one iteration costs with a planner's chosen point, waiting included."""

    plan_time_s: float
    plan_energy_j: float
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class Comparison:
    """An outcome relative to all-max under the same straggler."""

    saving_pct: float
    slowdown_pct: float
    time_s: float
    energy_j: float

    def to_json(self) -> dict[str, float]:
        """The per-case object of `perseusctl compare --json`: every field, by name, in order."""
        return asdict(self)


def fastest_point(points: Sequence[TimedPoint]) -> TimedPoint:
    """The fastest point (the lower energy on equal times, then the first)."""
    if not points:
        raise PlanningError("a planner produced no points")
    return min(points, key=lambda p: (p.time_s, p.energy_j))


def choose_point(
    points: Sequence[TimedPoint], wait_until_s: float, num_stages: int, p_block_w: float
) -> TimedPoint:
    """The point with time <= `wait_until_s` whose iteration, waiting included, costs the least energy.

    The energy compared is E_plan + S * P_block * (T' - T_plan), the energy actually spent until T' (the
    faster point on ties). The fastest point when none fits.
    """
    fitting = [p for p in points if p.time_s <= wait_until_s]
    if not fitting:
        return fastest_point(points)
    return min(fitting, key=lambda p: (outcome(p, wait_until_s, num_stages, p_block_w).energy_j, p.time_s))


def outcome(
    point: TimedPoint, wait_until_s: float | None, num_stages: int, p_block_w: float
) -> StragglerOutcome:
    """The iteration with `point`, waiting (at P_block on each of `num_stages` GPUs) until `wait_until_s`."""
    if wait_until_s is None or wait_until_s <= point.time_s:
        return StragglerOutcome(point.time_s, point.energy_j, point.time_s, point.energy_j)
    wait_s = wait_until_s - point.time_s
    energy_j = point.energy_j + num_stages * p_block_w * wait_s
    return StragglerOutcome(point.time_s, point.energy_j, wait_until_s, energy_j)


def straggler_outcome(
    point_set: PointSet, base_time_s: float, factor: float | None, num_stages: int, p_block_w: float
) -> StragglerOutcome:
    """A planner's iteration with a straggler of `factor` (None: no straggler) relative to `base_time_s`."""
    fastest = point_set.no_straggler or fastest_point(point_set.points)
    if factor is None:
        return outcome(fastest, None, num_stages, p_block_w)
    wait_until_s = factor * base_time_s
    if not point_set.uses_slack:
        return outcome(fastest, wait_until_s, num_stages, p_block_w)
    chosen = choose_point(point_set.points, wait_until_s, num_stages, p_block_w)
    return outcome(chosen, wait_until_s, num_stages, p_block_w)


def relative(result: StragglerOutcome, baseline: StragglerOutcome) -> Comparison:
    """Energy saving and slowdown of `result` against the all-max `baseline`, in percent."""
    return Comparison(
        saving_pct=100.0 * (1.0 - result.energy_j / baseline.energy_j),
        slowdown_pct=100.0 * (result.time_s / baseline.time_s - 1.0),
        time_s=result.time_s,
        energy_j=result.energy_j,
    )


def factor_key(factor: float | None) -> str:
    """The table key of a straggler factor: `none`, `1.05`, `1.1`, ..."""
    return NO_STRAGGLER if factor is None else repr(float(factor))


def compare_planners(
    planners: Mapping[str, PointSet],
    all_max: TimedPoint,
    num_stages: int,
    p_block_w: float,
    factors: Sequence[float] = STRAGGLER_FACTORS,
) -> dict[str, dict[str, Comparison]]:
    """Every planner's saving and slowdown vs all-max, with no straggler and with each straggler factor."""
    baseline = PointSet((all_max,), uses_slack=False)
    cases: list[float | None] = [None, *factors]
    table: dict[str, dict[str, Comparison]] = {}
    for name, point_set in planners.items():
        row = {}
        for factor in cases:
            base = straggler_outcome(baseline, all_max.time_s, factor, num_stages, p_block_w)
            result = straggler_outcome(point_set, all_max.time_s, factor, num_stages, p_block_w)
            row[factor_key(factor)] = relative(result, base)
        table[name] = row
    return table

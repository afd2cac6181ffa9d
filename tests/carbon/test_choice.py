"""Chase's cost on the frontier: a dirty grid picks a slower, cheaper point, a clean one a faster point, and
never a point outside the allowed set."""

from __future__ import annotations

import pytest

from perseusd.carbon.choice import ChaseWeights, allowed_points, chase_cost, choose_point
from perseusd.planner.policy import PointSummary

POINTS = [
    PointSummary(0, 1.30, 700.0),
    PointSummary(1, 1.10, 760.0),
    PointSummary(2, 1.02, 820.0),
    PointSummary(3, 1.00, 1000.0),
]
WEIGHTS = ChaseWeights(eta=0.5, reference_intensity=600.0, reference_power_w=800.0)


def test_a_dirty_grid_picks_a_slower_cheaper_point_than_a_clean_one() -> None:
    dirty = choose_point(POINTS, 3000.0, WEIGHTS)
    clean = choose_point(POINTS, 10.0, WEIGHTS)
    assert clean.index == 3
    assert dirty.time_s > clean.time_s
    assert dirty.energy_j < clean.energy_j
    costs = {p.index: chase_cost(p.time_s, p.energy_j, 3000.0, WEIGHTS) for p in POINTS}
    assert costs[dirty.index] == min(costs.values())


def test_the_choice_stays_inside_the_allowed_slowdown() -> None:
    allowed = allowed_points(POINTS, 1.05)
    assert [p.index for p in allowed] == [2, 3]
    assert choose_point(allowed, 1e6, WEIGHTS).index == 2


def test_nothing_allowed_means_the_fastest_point() -> None:
    assert [p.index for p in allowed_points(POINTS, 0.5)] == [3]


def test_bad_weights_and_empty_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="eta"):
        ChaseWeights(1.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="no frontier point"):
        choose_point([], 1.0, WEIGHTS)

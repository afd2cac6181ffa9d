"""Straggler accounting, checked against hand-computed numbers."""

from __future__ import annotations

import pytest

from perseusd.errors import PlanningError
from perseusd.planner.baselines import CandidatePoint
from perseusd.planner.straggler import (
    STRAGGLER_FACTORS,
    PointSet,
    choose_point,
    compare_planners,
    factor_key,
    outcome,
    relative,
    straggler_outcome,
)


def pts(*pairs: tuple[float, float]) -> tuple[CandidatePoint, ...]:
    return tuple(CandidatePoint(t, e, ()) for t, e in pairs)


FRONTIER = pts((1.0, 100.0), (1.2, 90.0), (1.5, 85.0))


def test_waiting_costs_blocking_power_on_every_gpu() -> None:
    result = outcome(FRONTIER[0], wait_until_s=1.3, num_stages=2, p_block_w=10.0)
    assert result.time_s == 1.3
    assert result.energy_j == pytest.approx(100.0 + 2 * 10.0 * 0.3)
    assert (result.plan_time_s, result.plan_energy_j) == (1.0, 100.0)


def test_a_plan_slower_than_the_straggler_has_nothing_to_wait_for() -> None:
    result = outcome(FRONTIER[2], wait_until_s=1.3, num_stages=2, p_block_w=10.0)
    assert (result.time_s, result.energy_j) == (1.5, 85.0)


def test_the_chosen_point_fits_before_the_straggler() -> None:
    result = straggler_outcome(PointSet(FRONTIER), 1.0, 1.3, num_stages=2, p_block_w=10.0)
    assert result.plan_time_s == 1.2  # 1.5 s does not fit in T' = 1.3 s
    assert result.energy_j == pytest.approx(90.0 + 2 * 10.0 * 0.1)
    assert result.time_s == pytest.approx(1.3)


def test_the_choice_minimises_energy_with_waiting_included() -> None:
    points = pts((1.0, 100.0), (1.1, 95.0), (1.2, 96.0))
    # E_plan alone prefers 1.1 s (95 J), but it then waits 0.1 s: 95 + 4*50*0.1 = 115 J > 96 J.
    assert choose_point(points, 1.2, num_stages=4, p_block_w=50.0) == points[2]
    assert choose_point(points, 1.15, num_stages=4, p_block_w=50.0) == points[1]
    assert choose_point(points, 0.9, num_stages=4, p_block_w=50.0) == points[0]  # none fits: the fastest


def test_no_straggler_runs_the_fastest_point_or_the_declared_one() -> None:
    no_wait = straggler_outcome(PointSet(FRONTIER), 1.0, None, 2, 10.0)
    assert (no_wait.time_s, no_wait.energy_j) == (1.0, 100.0)
    declared = straggler_outcome(PointSet(FRONTIER, no_straggler=FRONTIER[1]), 1.0, None, 2, 10.0)
    assert (declared.time_s, declared.energy_j) == (1.2, 90.0)


def test_a_planner_without_slack_keeps_its_plan_and_waits() -> None:
    result = straggler_outcome(PointSet(FRONTIER, uses_slack=False), 1.0, 1.5, num_stages=2, p_block_w=10.0)
    assert result.plan_time_s == 1.0
    assert result.energy_j == pytest.approx(100.0 + 2 * 10.0 * 0.5)


def test_relative_to_all_max() -> None:
    baseline = outcome(FRONTIER[0], 1.2, 2, 10.0)
    mine = outcome(FRONTIER[1], 1.2, 2, 10.0)
    comparison = relative(mine, baseline)
    assert comparison.saving_pct == pytest.approx(100 * (1 - 90.0 / 104.0))
    assert comparison.slowdown_pct == pytest.approx(0.0)
    slow = relative(outcome(FRONTIER[2], None, 2, 10.0), outcome(FRONTIER[0], None, 2, 10.0))
    assert slow.slowdown_pct == pytest.approx(50.0)
    assert slow.to_json() == {
        "saving_pct": slow.saving_pct,
        "slowdown_pct": slow.slowdown_pct,
        "time_s": 1.5,
        "energy_j": 85.0,
    }


def test_compare_planners_table() -> None:
    all_max = CandidatePoint(1.0, 100.0, ())
    table = compare_planners(
        {
            "same": PointSet((all_max,)),
            "frontier": PointSet(FRONTIER),
            "stuck": PointSet(FRONTIER[1:2], False),
        },
        all_max,
        num_stages=2,
        p_block_w=10.0,
    )
    assert list(table["same"]) == ["none", "1.05", "1.1", "1.2", "1.5"]
    for comparison in table["same"].values():
        assert comparison.saving_pct == pytest.approx(0.0, abs=1e-12)
        assert comparison.slowdown_pct == pytest.approx(0.0, abs=1e-12)
    # Factor 1.5: T' = 1.5 s; all-max spends 100 + 2*10*0.5 = 110 J, the frontier's 1.5 s point 85 J.
    assert table["frontier"]["1.5"].saving_pct == pytest.approx(100 * (1 - 85.0 / 110.0))
    assert table["frontier"]["none"].energy_j == 100.0
    # The stuck planner runs 1.2 s: 20 % slower without a straggler, and at 1.05 (T' = 1.05 s) too.
    assert table["stuck"]["none"].slowdown_pct == pytest.approx(20.0)
    assert table["stuck"]["1.05"].slowdown_pct == pytest.approx(100 * (1.2 / 1.05 - 1))
    assert table["stuck"]["1.5"].energy_j == pytest.approx(90.0 + 2 * 10.0 * 0.3)


def test_factor_keys() -> None:
    assert [factor_key(f) for f in (None, *STRAGGLER_FACTORS)] == ["none", "1.05", "1.1", "1.2", "1.5"]


def test_no_points_is_an_error() -> None:
    with pytest.raises(PlanningError, match="no points"):
        straggler_outcome(PointSet(()), 1.0, None, 2, 10.0)

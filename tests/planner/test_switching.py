"""Plans a GPU can follow: what each computation really runs at, given the clock-switch latency."""

from __future__ import annotations

import json

import pytest

from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.following import follow_frontier
from perseusd.planner.plan import (
    Frontier,
    PlanMeta,
    SwitchingMeta,
    frontier_from_points,
    frontier_to_document,
)
from perseusd.planner.plan_read import parse_frontier
from perseusd.planner.profile import Profile
from perseusd.planner.solver import SolverParams, solve_frontier
from perseusd.planner.switching import (
    SwitchModel,
    followable_point,
    followable_stage_clocks,
    late_begins,
    merged_stage_clocks,
    runs_of,
)
from tests.support.synthetic import synthetic_profile

H100 = SwitchModel(latency_s=0.012, lead_s=0.014)  # a lock acts ~12 ms after it is asked for
CLOCKS = (900, 1200, 1500, 1980)


def _time_at(times_s: list[float]):  # type: ignore[no-untyped-def]
    """Computation i takes times_s[i] at 1980 MHz and proportionally longer at lower clocks."""
    return lambda i, clock_mhz: times_s[i] * 1980 / clock_mhz


def _snap(_i: int, clock_mhz: int) -> int:
    return min((c for c in CLOCKS if c >= clock_mhz), default=max(CLOCKS))


def test_runs_are_cyclic() -> None:
    assert runs_of([1, 1, 2, 2, 1]) == [[2, 3], [4, 0, 1]]
    assert runs_of([3, 3]) == [[0, 1]]
    assert runs_of([]) == []


def test_long_computations_keep_their_clocks() -> None:
    clocks = [1980, 900, 1500, 1200]
    assert followable_stage_clocks(clocks, _time_at([0.04] * 4), _snap, H100) == clocks


def test_instant_switches_keep_every_clock() -> None:
    clocks = [1980, 900, 1500, 900, 1980, 1200]
    instant = SwitchModel(0.0, 0.0)
    assert followable_stage_clocks(clocks, _time_at([0.001] * 6), _snap, instant) == clocks


def test_a_short_valley_runs_at_the_clock_before_it() -> None:
    """A lowering acts 12 ms into the run: a 5 ms computation at 900 MHz finishes at 1980 MHz."""
    clocks = [1980, 900, 1980, 1980]
    times = [0.040, 0.005 * 900 / 1980, 0.040, 0.040]
    assert followable_stage_clocks(clocks, _time_at(times), _snap, H100) == [1980] * 4


def test_only_the_start_of_a_long_lowered_run_runs_high() -> None:
    clocks = [1980, 1200, 1200, 1200]
    times = [0.040, 0.008, 0.008, 0.008]  # at 1200 MHz 13 ms each: the lowering acts inside the first
    assert followable_stage_clocks(clocks, _time_at(times), _snap, H100) == [1980, 1980, 1200, 1200]


def test_a_raise_after_a_short_run_comes_late() -> None:
    """A raise into the 1980 run is asked for at the 5 ms run's begin and acts 12 ms later: that run runs
    at 1980, and the raised run's first computation (4 ms) mostly before it, at the run's lower clock."""
    clocks = [900, 1200, 1980, 1980, 900]
    times = [0.030, 0.004, 0.003, 0.030, 0.030]
    effective = followable_stage_clocks(clocks, _time_at(times), _snap, H100)
    assert effective == [900, 1200, 1200, 1980, 900]


def test_a_raise_after_a_long_run_is_in_time() -> None:
    clocks = [900, 900, 1980, 900]
    times = [0.030, 0.030, 0.030, 0.030]
    assert followable_stage_clocks(clocks, _time_at(times), _snap, H100) == clocks


def test_followable_point_counts_what_changed() -> None:
    stages = ([1980, 900, 1980, 1980], [1500, 1500, 1500, 1500])
    times = [0.040, 0.002, 0.040, 0.040]
    point = followable_point(stages, lambda _s: _time_at(times), lambda _s: _snap, H100)
    assert point.clocks_mhz == ((1980,) * 4, (1500,) * 4)
    assert point.changed == 1


def test_model_is_checked() -> None:
    with pytest.raises(ValueError, match="latency_s, lead_s >= 0"):
        SwitchModel(latency_s=-0.01, lead_s=0.01)


def _frontier() -> tuple[Frontier, ComputationDag, Profile]:
    profile = synthetic_profile(2, seed=3)
    dag = build_dag("1f1b", 2, 4, 1)
    points = list(solve_frontier(dag, profile, SolverParams(unit_time_s=0.001, p_block_w=80.0)))
    meta = PlanMeta.for_dag(dag, profile, 0.001, 80.0)
    return frontier_from_points(dag, points, meta, [p.refined_time_s for p in points]), dag, profile


def test_instant_switches_leave_the_frontier_as_solved() -> None:
    frontier, dag, profile = _frontier()
    followed = follow_frontier(frontier, dag, profile, 80.0, SwitchModel(0.0, 0.0))
    assert followed.switching == SwitchingMeta(latency_s=0.0, lead_s=0.0, min_run_s=0.0)
    for before, after in zip(frontier.points, followed.points, strict=True):
        assert after.followed is not None
        assert after.followed.effective_clocks_mhz == after.clocks_mhz == before.clocks_mhz
        assert after.followed.switch_changed == 0
        assert after.followed.solved_clocks_mhz is None
        assert after.refined_energy_j == pytest.approx(before.refined_energy_j)
        assert after.refined_time_s == pytest.approx(before.refined_time_s)


def test_slow_switches_state_what_the_gpus_will_do() -> None:
    """20 ms computations, switches that act after 30 ms: most planned changes cannot happen in time."""
    frontier, dag, profile = _frontier()
    followed = follow_frontier(frontier, dag, profile, 80.0, SwitchModel(0.03, 0.032))
    assert all(point.followed is None for point in frontier.points)  # a new frontier, the caller's as it was
    changed = [p for p in followed.points if p.followed is not None and p.followed.switch_changed]
    assert changed
    for point, before in ((p, frontier.points[p.index or 0]) for p in changed):
        assert point.followed is not None
        assert point.followed.effective_clocks_mhz != point.clocks_mhz
        assert point.followed.planned_energy_j == before.refined_energy_j != point.refined_energy_j
        assert point.followed.planned_time_s == before.refined_time_s
        node_clocks = [0] * dag.num_computations
        for ids, clocks in zip(dag.stage_orders, point.followed.effective_clocks_mhz, strict=True):
            for node, clock in zip(ids, clocks, strict=True):
                node_clocks[node] = clock
        evaluation = evaluate_clocks(dag, profile, node_clocks, 80.0)
        assert point.refined_time_s == pytest.approx(evaluation.time_s)
        assert point.refined_energy_j == pytest.approx(evaluation.energy_j)


def test_a_followed_frontier_is_written_and_read_back_as_it_is() -> None:
    """The switch-aware fields survive the document (the job cache and `perseusctl frontier` read them)."""
    frontier, dag, profile = _frontier()
    followed = follow_frontier(frontier, dag, profile, 80.0, SwitchModel(0.01, 0.012, min_run_s=0.03))
    assert any(p.followed is not None and p.followed.solved_clocks_mhz is not None for p in followed.points)
    text = json.dumps(frontier_to_document(followed))
    assert parse_frontier(text, "followed") == followed
    assert json.dumps(frontier_to_document(parse_frontier(text, "followed"))) == text


def test_short_lowered_runs_join_a_higher_neighbour() -> None:
    """A 10 ms run at 1005 between runs at 1410 and 1200 joins the 1200 run (the lower higher neighbour);
    a short run higher than both neighbours stays; a long lowered run stays."""
    clocks = [1410, 1410, 1005, 1200, 1200, 1500, 1005, 1005, 1005]
    times = [0.02, 0.02, 0.01, 0.02, 0.02, 0.005, 0.02, 0.02, 0.02]

    def time_at(i: int, _clock: int) -> float:
        return times[i]

    merged = merged_stage_clocks(clocks, time_at, lambda _i, clock: clock, 0.03)
    assert merged == [1410, 1410, 1200, 1200, 1200, 1500, 1005, 1005, 1005]
    assert merged_stage_clocks(clocks, time_at, lambda _i, clock: clock, 0.0) == clocks


def test_late_begins_count_what_the_daemon_sees_begin_at_another_clock() -> None:
    """A lowered run's computations until the lowering acts; a raised run's until the raise acts when the
    run before it is too short to raise ahead; the run before a raise from when the raise acts."""
    assert late_begins([1980, 1980, 1980], _time_at([0.001] * 3), H100) == 0
    # lowering into 900 (computation 2 begins at once, 3 after 20 ms); the raise back acts 2 ms before
    # the 900 run ends, when no computation of it begins
    assert late_begins([1980, 1980, 900, 900], lambda _i, _c: 0.02, H100) == 1
    # a 5 ms lowered run: it begins at the old clock, and the raise after it acts 7 ms into the raised run
    assert late_begins([900, 1980, 1980], lambda i, _c: [0.005, 0.02, 0.02][i], H100) == 2
    # lowering into 900: computations 0 and 1 begin before it acts (0 and 10 ms); the 1 ms computation 2
    # ends the run before a raise and begins after the raise acted (19 ms)
    times = [0.01, 0.01, 0.001, 0.03]
    assert late_begins([900, 900, 900, 1980], lambda i, _c: times[i], H100) == 3

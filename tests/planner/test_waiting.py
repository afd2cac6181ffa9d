"""Waiting power by held clock (`perseusd.planner.waiting`): a GPU idling at a lower locked clock draws less,
and a followed plan's waits are counted at the clocks they hold."""

from __future__ import annotations

import pytest

from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.evaluate import evaluate_clocks, longest_path_s
from perseusd.planner.following import follow_frontier
from perseusd.planner.plan import PlanMeta, frontier_from_points
from perseusd.planner.profile import Profile
from perseusd.planner.solver import SolverParams, solve_frontier
from perseusd.planner.switching import SwitchModel
from perseusd.planner.waiting import WaitingPower, held_waiting_j
from tests.support.synthetic import synthetic_profile

H100_IDLE = WaitingPower(130.19, ((900, 79.12), (1440, 99.97), (1980, 130.19)))
"""The `h100_sxm` board's idle power locked at three clocks (measured on an H100)."""


def test_waiting_power_is_linear_between_measured_clocks_and_the_nearest_beyond() -> None:
    assert H100_IDLE.at_w(1440) == 99.97
    assert H100_IDLE.at_w(1170) == pytest.approx((79.12 + 99.97) / 2)
    assert H100_IDLE.at_w(345) == 79.12  # below the lowest measured clock: its power, no extrapolation
    assert H100_IDLE.at_w(2100) == 130.19
    assert WaitingPower(80.0).constant
    assert WaitingPower(80.0, ((900, 80.0), (1980, 80.0))).constant
    assert not H100_IDLE.constant
    assert WaitingPower(80.0).at_w(900) == 80.0


@pytest.mark.parametrize("points", [((1440, 100.0), (900, 79.0)), ((900, 79.0), (900, 80.0)), ((900, -1.0),)])
def test_bad_waiting_powers_are_refused(points: tuple[tuple[int, float], ...]) -> None:
    with pytest.raises(ValueError, match="waiting power"):
        WaitingPower(100.0, points)


def test_one_waiting_power_is_the_blocking_model() -> None:
    dag = build_dag("1f1b", 4, 6, 1)
    times_s = [0.01 + 0.001 * (node % 7) for node in range(dag.num_computations)]
    clocks = [900 + 15 * (node % 5) for node in range(dag.num_computations)]
    time_s = longest_path_s(dag, times_s) + 0.004  # an iteration longer than its longest path
    busy_s = sum(times_s)
    expected_j = 80.0 * (dag.num_stages * time_s - busy_s)
    assert held_waiting_j(dag, times_s, clocks, time_s, WaitingPower(80.0), 0.01) == pytest.approx(expected_j)


def test_a_wait_is_held_at_the_next_computations_clock_a_lowering_acts_late() -> None:
    """2 stages, 1 microbatch: F0 (0-1 s), F1 (1-2), B1 (2-4), B0 (4-6). Stage 0 waits 3 s before B0 and
    stage 1 3 s before F1 (from B1's end to the next iteration's F1); both are lowerings, so their first
    0.5 s (the lock latency) are at the clock before."""
    dag = build_dag("1f1b", 2, 1, 1)
    times_s = [1.0, 2.0, 1.0, 2.0]  # F0, B0, F1, B1
    clocks = [1980, 1170, 900, 1980]
    waiting = H100_IDLE
    stage0_j = 0.5 * 130.19 + 2.5 * waiting.at_w(1170)
    stage1_j = 0.5 * 130.19 + 2.5 * 79.12
    assert held_waiting_j(dag, times_s, clocks, 6.0, waiting, 0.5) == pytest.approx(stage0_j + stage1_j)
    raised = [900, 1980, 1440, 900]  # raises are made ahead: the whole wait at the higher clock
    assert held_waiting_j(dag, times_s, raised, 6.0, waiting, 0.5) == pytest.approx(3 * 130.19 + 3 * 99.97)


def test_a_followed_plan_waits_at_the_clocks_it_holds() -> None:
    """The frontier's points, followed with a waiting power that falls with the clock: each point's energy
    is its computations' plus its waits at the held clocks, below the blocking model's where it lowers
    clocks; with one waiting power the figures are the blocking model's, to the bit."""
    profile = synthetic_profile(4, seed=5)
    dag = build_dag("1f1b", 4, 4, 1)
    p_block_w = 100.0
    points = list(solve_frontier(dag, profile, SolverParams(unit_time_s=0.001, p_block_w=p_block_w)))
    meta = PlanMeta.for_dag(dag, profile, 0.001, p_block_w)
    frontier = frontier_from_points(dag, points, meta, [p.refined_time_s for p in points])
    model = SwitchModel(0.005, 0.007)
    waiting = WaitingPower(p_block_w, ((885, 60.0), (1410, p_block_w)))
    blocking = follow_frontier(frontier, dag, profile, p_block_w, model)
    same = follow_frontier(frontier, dag, profile, p_block_w, model, WaitingPower(p_block_w))
    held = follow_frontier(frontier, dag, profile, p_block_w, model, waiting)
    assert [p.refined_energy_j for p in same.points] == [p.refined_energy_j for p in blocking.points]
    lowered = 0
    for old, new in zip(blocking.points, held.points, strict=True):
        assert new.followed is not None
        assert old.followed is not None
        assert new.refined_time_s == old.refined_time_s
        node_clocks = [clock for row in new.followed.effective_clocks_mhz for clock in row]
        evaluation = evaluate_clocks(dag, profile, node_clocks, p_block_w)
        times_s = _times(dag, profile, node_clocks)
        waits_j = held_waiting_j(dag, times_s, node_clocks, new.refined_time_s, waiting, 0.005)
        assert new.refined_energy_j == pytest.approx(evaluation.compute_energy_j + waits_j)
        correction_j = new.refined_energy_j - old.refined_energy_j
        assert new.followed.planned_energy_j == pytest.approx(old.followed.planned_energy_j + correction_j)
        if min(node_clocks) < 1410:
            lowered += 1
            assert new.refined_energy_j < old.refined_energy_j
    assert lowered > 0


def _times(dag: ComputationDag, profile: Profile, node_clocks: list[int]) -> list[float]:
    return [
        profile.lookup(dag.virtual_stage(n), c.instruction, node_clocks[n]).time_s
        for n, c in enumerate(dag.computations)
    ]

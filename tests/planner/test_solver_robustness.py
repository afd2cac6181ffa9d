"""Where the reference is fragile the solver gives a correct frontier or a clear error, never a crash."""

from __future__ import annotations

import pytest

from perseusd.errors import PlanningError
from perseusd.planner.dag import Instruction, build_dag
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.solver import FrontierPoint, FrontierSolver, SolverParams
from tests.support.synthetic import synthetic_profile


def solve(
    profile: Profile, params: SolverParams, stages: int = 3, microbatches: int = 4
) -> list[FrontierPoint]:
    return list(FrontierSolver(build_dag("1f1b", stages, microbatches), profile, params).points())


def test_energy_in_millijoules_gives_the_same_frontier_scaled() -> None:
    profile = synthetic_profile(3, 7, base_time_s=0.03)
    joules = solve(profile, SolverParams(0.001, 70.0))
    millijoules = solve(profile.scaled(energy_factor=1000.0), SolverParams(0.001, 70_000.0))
    assert [p.time_s for p in millijoules] == [p.time_s for p in joules]
    for j, mj in zip(joules, millijoules, strict=True):
        assert mj.refined_energy_j == pytest.approx(j.refined_energy_j * 1000.0, rel=1e-3)


def test_energy_in_kilojoules_gives_a_correct_frontier() -> None:
    profile = synthetic_profile(3, 8, base_time_s=0.03)
    joules = solve(profile, SolverParams(0.001, 70.0))
    kilojoules = solve(profile.scaled(energy_factor=1e-3), SolverParams(0.001, 0.07))
    assert [p.time_s for p in kilojoules] == [p.time_s for p in joules]
    assert kilojoules[0].refined_energy_j == pytest.approx(joules[0].refined_energy_j * 1e-3, rel=1e-2)


def test_time_in_milliseconds_with_a_matching_unit_time() -> None:
    profile = synthetic_profile(3, 9, base_time_s=0.03)
    seconds = solve(profile, SolverParams(0.001, 70.0))
    millis = solve(profile.scaled(time_factor=1000.0), SolverParams(1.0, 0.07))
    # floor division on rescaled floats may move a bucket boundary by one unit, nothing more
    assert abs(len(millis) - len(seconds)) <= 2
    assert millis[-1].time_s == pytest.approx(seconds[-1].time_s * 1000.0, abs=2.0)


def one_clock_profile(stages: int) -> Profile:
    rows = [
        Measurement(s, i, 1410, 0.02 * (2 if i is Instruction.BACKWARD else 1), 5.0)
        for s in range(stages)
        for i in Instruction
    ]
    return Profile.from_measurements(rows)


def test_a_single_clock_gives_a_single_plan_and_no_steps() -> None:
    solver = FrontierSolver(build_dag("1f1b", 2, 3), one_clock_profile(2), SolverParams(0.001, 60.0))
    assert solver.t_min_quant == solver.t_max_quant
    assert list(solver.points()) == []


def test_identical_options_collapse_to_one() -> None:
    rows = [
        Measurement(s, i, f, 0.02, 5.0) for s in range(2) for i in Instruction for f in (1410, 1200, 1000)
    ]
    solver = FrontierSolver(
        build_dag("1f1b", 2, 2), Profile.from_measurements(rows), SolverParams(0.001, 60.0)
    )
    assert all(len(o.options) == 1 for o in solver.option_sets.values())
    assert list(solver.points()) == []


def test_a_failed_exponential_fit_falls_back_to_a_convex_model() -> None:
    """Three options per computation: the reference's fit fails for every guess (lowtime raises)."""
    rows = []
    for s in range(2):
        for i, scale in ((Instruction.FORWARD, 1.0), (Instruction.BACKWARD, 2.0)):
            for f, t, e in ((1410, 0.020, 6.0), (1200, 0.024, 5.0), (1000, 0.030, 4.6)):
                rows.append(Measurement(s, i, f, t * scale, e * scale))
    dag = build_dag("1f1b", 2, 3)
    solver = FrontierSolver(dag, Profile.from_measurements(rows), SolverParams(0.001, 40.0))
    assert set(solver.describe_models().values()) == {"convex-hull"}
    points = list(solver.points())
    assert points[-1].quant_time == solver.t_min_quant
    fastest = evaluate_clocks(dag, solver.profile, points[-1].clocks_mhz, 40.0)
    assert fastest.time_s == pytest.approx(points[-1].refined_time_s)


def test_unit_time_larger_than_a_computation_is_a_clear_error() -> None:
    with pytest.raises(PlanningError, match="smaller --unit-time"):
        FrontierSolver(build_dag("1f1b", 2, 2), synthetic_profile(2, 1), SolverParams(1.0, 60.0))


def test_missing_stage_in_profile_is_a_clear_error() -> None:
    with pytest.raises(PlanningError, match=r"no (forward|backward) measurements for stage 3"):
        FrontierSolver(build_dag("1f1b", 4, 2), synthetic_profile(3, 1), SolverParams(0.001, 60.0))


def test_negative_blocking_power_is_refused() -> None:
    with pytest.raises(PlanningError, match="blocking power"):
        FrontierSolver(build_dag("1f1b", 2, 2), synthetic_profile(2, 1), SolverParams(0.001, -1.0))


def test_solver_does_not_mutate_its_inputs() -> None:
    dag = build_dag("gpipe", 3, 3)
    profile = synthetic_profile(3, 4)
    before = (dag.successors, profile.measurements)
    list(FrontierSolver(dag, profile, SolverParams(0.001, 50.0)).points())
    assert (dag.successors, profile.measurements) == before

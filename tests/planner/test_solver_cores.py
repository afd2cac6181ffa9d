"""The C core and the pure-Python reference core give bit-identical frontiers on every schedule."""

from __future__ import annotations

import pytest

from perseusd.planner.dag import build_dag
from perseusd.planner.solver import FrontierSolver, SolverParams, load_c_core
from tests.support.synthetic import synthetic_profile

CASES = [
    ("1f1b", 3, 5, 1, 1),
    ("1f1b", 4, 8, 1, 2),
    ("gpipe", 3, 4, 1, 3),
    ("interleaved", 2, 4, 2, 4),
    ("1f1b", 2, 2, 1, 5),
]


@pytest.mark.parametrize(("schedule", "stages", "microbatches", "chunks", "seed"), CASES)
def test_c_core_matches_python_reference(
    schedule: str, stages: int, microbatches: int, chunks: int, seed: int
) -> None:
    if load_c_core() is None:
        pytest.fail("the C solver core was not built: scripts/setup.sh builds it")
    dag = build_dag(schedule, stages, microbatches, chunks)
    profile = synthetic_profile(stages * chunks, seed, plateau=seed % 2 == 0)
    for reference_stop in (False, True):
        c_params = SolverParams(0.001, 80.0, core="c", reference_stop=reference_stop)
        py_params = SolverParams(0.001, 80.0, core="python", reference_stop=reference_stop)
        c_points = list(FrontierSolver(dag, profile, c_params).points())
        assert c_points == list(FrontierSolver(dag, profile, py_params).points())
        assert len(c_points) > 3 or reference_stop


def test_frontier_is_monotone_and_consistent() -> None:
    dag = build_dag("1f1b", 4, 6)
    profile = synthetic_profile(4, 11)
    solver = FrontierSolver(dag, profile, SolverParams(0.001, 75.0))
    points = list(solver.points())
    expected = list(range(solver.t_max_quant - 1, solver.t_min_quant - 1, -1))
    assert [p.quant_time for p in points] == expected, "one unit time faster per point, down to T_min"
    for p in points:
        assert len(p.clocks_mhz) == dag.num_computations
        assert p.refined_time_s == pytest.approx(p.time_s, rel=0.05)
    assert len({p.clocks_mhz for p in points}) > len(points) // 2, "plans change along the frontier"


def test_plateau_profile_is_not_cut_short_by_a_flat_cost_model() -> None:
    """A profile whose cost model is flat at the slow end: the reference stops at once, we go on to T_min."""
    dag = build_dag("1f1b", 4, 8)
    profile = synthetic_profile(4, 2, plateau=True)
    reference = list(FrontierSolver(dag, profile, SolverParams(0.001, 80.0, reference_stop=True)).points())
    solver = FrontierSolver(dag, profile, SolverParams(0.001, 80.0))
    robust = list(solver.points())
    assert len(reference) < 3
    assert robust[: len(reference)] == reference
    assert robust[-1].quant_time == solver.t_min_quant

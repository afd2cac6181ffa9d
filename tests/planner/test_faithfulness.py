"""The solver reproduces every published Perseus frontier row for row (solver spec, section 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseusd.planner.dag import build_dag
from perseusd.planner.profile_csv import read_profile
from perseusd.planner.solver import FrontierSolver, SolverParams, load_c_core

CASES = [
    # (gpu, microbatches, unit time s, blocking power W)
    ("a100_sxm", 12, 0.001, 83.64),
    ("a100_sxm", 24, 0.001, 83.64),
    ("a40", 12, 0.0001, 70.38),
]


def published(reference_data: Path, gpu: str, microbatches: int) -> list[tuple[float, float]]:
    path = reference_data / "perseus-artifact" / "frontiers" / f"{gpu}_gpt3-175b_bf16_mb{microbatches}.csv"
    lines = path.read_text().split()
    assert lines[0] == "time,energy"
    return [(float(t), float(e)) for t, e in (line.split(",") for line in lines[1:])]


def assert_reproduces(solver: FrontierSolver, reference: list[tuple[float, float]]) -> None:
    points = list(solver.points())
    assert len(points) == len(reference)
    for point, (time_s, energy_j) in zip(points, reference, strict=True):
        assert point.time_s == time_s, f"point {point.index}"
        assert point.model_energy_j == pytest.approx(energy_j, rel=1e-6, abs=0), f"point {point.index}"


@pytest.mark.parametrize(("gpu", "microbatches", "unit_time_s", "p_block_w"), CASES)
def test_reproduces_published_frontier(
    reference_data: Path, gpu: str, microbatches: int, unit_time_s: float, p_block_w: float
) -> None:
    if load_c_core() is None:
        pytest.fail("the C solver core was not built: scripts/setup.sh builds it")
    profile = read_profile(reference_data / "perseus-artifact" / "profiles" / f"gpt3-175b+{gpu}_bf16.csv")
    solver = FrontierSolver(build_dag("1f1b", 8, microbatches), profile, SolverParams(unit_time_s, p_block_w))
    assert_reproduces(solver, published(reference_data, gpu, microbatches))


def test_python_reference_core_reproduces_published_frontier(reference_data: Path) -> None:
    profile = read_profile(reference_data / "perseus-artifact" / "profiles" / "gpt3-175b+a100_sxm_bf16.csv")
    params = SolverParams(0.001, 83.64, core="python")
    solver = FrontierSolver(build_dag("1f1b", 8, 12), profile, params)
    assert_reproduces(solver, published(reference_data, "a100_sxm", 12))

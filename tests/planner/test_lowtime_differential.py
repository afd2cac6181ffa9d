"""Differential tests against the reference solver lowtime 0.3.0 on many random small cases.

With `reference_stop` both must agree exactly: identical frontier times, energies within 1e-6 relative and
identical clocks for every computation at every point.
"""

from __future__ import annotations

import random

import pytest

from benchmarks.peers.lowtime_peer import lowtime_frontier
from perseusd.planner.dag import build_dag
from perseusd.planner.solver import FrontierSolver, SolverParams
from tests.support.synthetic import synthetic_profile

# lowtime's own fits overflow and warn on some initial guesses; those warnings are its, not ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::scipy.optimize.OptimizeWarning"),
]


def random_case(seed: int) -> tuple[int, int, float, bool, float]:
    rng = random.Random(seed)
    return (
        rng.randint(2, 4),
        rng.randint(2, 8),
        rng.choice([0.0, 0.5, 1.0]),
        rng.random() < 0.4,
        rng.uniform(0, 90),
    )


@pytest.mark.parametrize("seed", range(24))
def test_matches_lowtime(seed: int) -> None:
    stages, microbatches, imbalance, plateau, p_block_w = random_case(seed)
    dag = build_dag("1f1b", stages, microbatches)
    profile = synthetic_profile(stages, 1000 + seed, imbalance=imbalance, plateau=plateau, base_time_s=0.03)
    params = SolverParams(unit_time_s=0.001, p_block_w=p_block_w, reference_stop=True)
    ours = list(FrontierSolver(dag, profile, params).points())
    theirs = list(lowtime_frontier(dag, profile, params.unit_time_s, p_block_w))
    assert [p.time_s for p in ours] == [p.time_s for p in theirs]
    for mine, peer in zip(ours, theirs, strict=True):
        assert mine.model_energy_j == pytest.approx(peer.energy_j, rel=1e-6)
        assert mine.clocks_mhz == peer.clocks_mhz, f"point {mine.index}"


def test_cases_are_not_trivial() -> None:
    """The random cases exercise long frontiers, not just one or two points."""
    lengths = []
    for seed in range(24):
        stages, microbatches, imbalance, plateau, p_block_w = random_case(seed)
        profile = synthetic_profile(
            stages, 1000 + seed, imbalance=imbalance, plateau=plateau, base_time_s=0.03
        )
        params = SolverParams(0.001, p_block_w, reference_stop=True)
        lengths.append(
            len(list(FrontierSolver(build_dag("1f1b", stages, microbatches), profile, params).points()))
        )
    assert sum(n >= 10 for n in lengths) >= 16, lengths

"""The exact MILP optimum against brute-force enumeration, and against the Perseus frontier."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest

from perseusd.errors import PlanningError
from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.exact import exact_frontier, exact_min_energy
from perseusd.planner.exact_gap import frontier_gap
from perseusd.planner.exact_problem import OptionSpace
from perseusd.planner.options import build_option_set
from perseusd.planner.profile import Profile
from perseusd.planner.solver import FrontierSolver, SolverParams
from tests.support.synthetic import synthetic_profile

UNIT_S = 0.001
P_BLOCK_W = 70.0
FEW_CLOCKS = (1410, 1200, 1005)

pytest.importorskip("highspy")


def _node_options(
    dag: ComputationDag, profile: Profile, space: OptionSpace
) -> list[list[tuple[int, int, float]]]:
    """Per node: (clock, quantised time, effective cost) of every option, computed here from the rows."""
    table = []
    for node, comp in enumerate(dag.computations):
        stage = dag.virtual_stage(node)
        rows = profile.options(stage, comp.instruction)
        if space == "filtered":
            option_set = build_option_set(stage, comp.instruction, rows, UNIT_S, P_BLOCK_W)
            rows = tuple(profile.lookup(stage, comp.instruction, o.freq_mhz) for o in option_set.options)
        options = []
        for m in rows:
            q = int(m.time_s // UNIT_S)
            options.append((m.freq_mhz, q, m.energy_j - P_BLOCK_W * q * UNIT_S))
        table.append(options)
    return table


def _brute_force(
    dag: ComputationDag, table: list[list[tuple[int, int, float]]]
) -> tuple[np.ndarray, np.ndarray]:
    """Makespan and effective cost of every assignment of one option per node (vectorised)."""
    choices = np.array(list(itertools.product(*(range(len(o)) for o in table))), dtype=np.int64)
    width = max(len(opts) for opts in table)
    quant = np.array([[o[1] for o in opts] + [0] * (width - len(opts)) for opts in table])
    cost = np.array([[o[2] for o in opts] + [0.0] * (width - len(opts)) for opts in table])
    nodes = np.arange(dag.num_computations)
    durations = quant[nodes, choices]
    finish = np.zeros_like(durations)
    for node in dag.topological_order:
        preds = list(dag.predecessors[node])
        start = finish[:, preds].max(axis=1) if preds else 0
        finish[:, node] = start + durations[:, node]
    return finish.max(axis=1), cost[nodes, choices].sum(axis=1)


def _best_by_deadline(makespans: np.ndarray, costs: np.ndarray, deadlines: list[int]) -> dict[int, float]:
    order = np.argsort(makespans, kind="stable")
    sorted_span, running_min = makespans[order], np.minimum.accumulate(costs[order])
    best = {}
    for deadline in deadlines:
        count = int(np.searchsorted(sorted_span, deadline, side="right"))
        if count:
            best[deadline] = float(running_min[count - 1])
    return best


def _effective_cost_j(dag: ComputationDag, profile: Profile, result_clocks: tuple[int, ...]) -> float:
    """A plan's effective cost re-evaluated from the profile rows: energy - P_block * quantised time."""
    total = 0.0
    for node, clock in enumerate(result_clocks):
        m = profile.lookup(dag.virtual_stage(node), dag.computations[node].instruction, clock)
        total += m.energy_j - P_BLOCK_W * int(m.time_s // UNIT_S) * UNIT_S
    return total


PLATEAU_CLOCKS = (1410, 1275, 1140, 1005)


@pytest.mark.parametrize(
    ("microbatches", "seed", "space", "clocks", "plateau"),
    [
        (2, 3, "all", PLATEAU_CLOCKS, True),
        (2, 10, "filtered", PLATEAU_CLOCKS, True),
        (3, 5, "all", FEW_CLOCKS, False),
        (3, 6, "filtered", FEW_CLOCKS, False),
    ],
)
def test_milp_matches_brute_force(
    microbatches: int, seed: int, space: OptionSpace, clocks: tuple[int, ...], plateau: bool
) -> None:
    profile = synthetic_profile(2, seed, clocks_mhz=clocks, imbalance=0.6, plateau=plateau)
    dag = build_dag("1f1b", 2, microbatches)
    table = _node_options(dag, profile, space)
    makespans, costs = _brute_force(dag, table)
    t_min, t_max = int(makespans.min()), int(makespans.max())
    # Every deadline near T_min (where the trade-offs are tight), every third one above, and past T_max.
    deadlines = sorted({*range(t_min - 2, t_min + 12), *range(t_min, t_max + 3, 3), t_max, t_max + 2})
    best = _best_by_deadline(makespans, costs, deadlines)
    results = exact_frontier(dag, profile, UNIT_S, P_BLOCK_W, deadlines, option_space=space)
    assert [r.deadline_quant for r in results] == sorted(best)
    distinct = set()
    for r in results:
        expected = best[r.deadline_quant]
        assert r.optimal
        assert r.effective_cost_j == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert r.makespan_quant <= r.deadline_quant
        durations = [
            int(profile.lookup(dag.virtual_stage(n), c.instruction, r.clocks_mhz[n]).time_s // UNIT_S)
            for n, c in enumerate(dag.computations)
        ]
        assert list(r.durations_quant) == durations
        assert _effective_cost_j(dag, profile, r.clocks_mhz) == pytest.approx(expected, rel=1e-9)
        blocking = dag.num_stages * r.deadline_quant * UNIT_S * P_BLOCK_W
        assert r.energy_j == pytest.approx(expected + blocking, rel=1e-12)
        distinct.add(round(expected, 9))
    assert len(distinct) > 3, "the case is too easy to tell a wrong optimum from a right one"


def test_raw_clocks_never_worse_than_filtered_options() -> None:
    profile = synthetic_profile(2, 11, clocks_mhz=(1410, 1305, 1200, 1095, 990), imbalance=0.5)
    dag = build_dag("1f1b", 2, 3)
    times = list(range(FrontierSolver(dag, profile, SolverParams(UNIT_S, P_BLOCK_W)).t_min_quant, 400, 7))
    filtered = exact_frontier(dag, profile, UNIT_S, P_BLOCK_W, times)
    raw = exact_frontier(dag, profile, UNIT_S, P_BLOCK_W, times, option_space="all")
    assert [r.deadline_quant for r in raw] == [r.deadline_quant for r in filtered] == times
    for f, a in zip(filtered, raw, strict=True):
        assert a.energy_j <= f.energy_j + 1e-9


def _perseus_energy(
    dag: ComputationDag, profile: Profile, clocks: tuple[int, ...], quant_time: int
) -> tuple[int, float]:
    durations = [
        int(profile.lookup(dag.virtual_stage(n), c.instruction, clocks[n]).time_s // UNIT_S)
        for n, c in enumerate(dag.computations)
    ]
    finish = [0] * dag.num_computations
    for node in dag.topological_order:
        finish[node] = durations[node] + max((finish[p] for p in dag.predecessors[node]), default=0)
    effective = _effective_cost_j(dag, profile, clocks)
    return max(finish), effective + dag.num_stages * quant_time * UNIT_S * P_BLOCK_W


@pytest.mark.parametrize(("stages", "microbatches", "seed"), [(2, 3, 21), (3, 3, 22)])
def test_exact_never_above_perseus(stages: int, microbatches: int, seed: int) -> None:
    profile = synthetic_profile(stages, seed, imbalance=0.6)
    dag = build_dag("1f1b", stages, microbatches)
    points = list(FrontierSolver(dag, profile, SolverParams(UNIT_S, P_BLOCK_W)).points())
    assert len(points) > 20
    gaps = []
    for point in points[:: max(1, len(points) // 12)]:
        makespan, perseus_j = _perseus_energy(dag, profile, point.clocks_mhz, point.quant_time)
        assert makespan <= point.quant_time
        # Unseeded: the MILP does not start from the Perseus plan, so this is a real comparison.
        exact = exact_min_energy(dag, profile, UNIT_S, P_BLOCK_W, point.quant_time)
        assert exact is not None
        assert exact.optimal
        assert exact.energy_j <= perseus_j + 1e-9 * abs(perseus_j)
        gaps.append((perseus_j - exact.energy_j) / exact.energy_j)
    assert max(gaps) < 0.05

    rows = frontier_gap(dag, profile, UNIT_S, P_BLOCK_W, sample=4)
    assert [r["index"] for r in rows] == [
        0,
        round((len(points) - 1) / 3),
        round(2 * (len(points) - 1) / 3),
        len(points) - 1,
    ]
    for row in rows:
        point = points[int(row["index"])]
        makespan, perseus_j = _perseus_energy(dag, profile, point.clocks_mhz, point.quant_time)
        assert row["quant_time"] == point.quant_time
        assert row["perseus_makespan_quant"] == makespan
        assert row["perseus_energy_j"] == pytest.approx(perseus_j, rel=1e-12)
        exact_j, all_j = float(row["exact_energy_j"]), float(row["exact_all_energy_j"])
        assert all_j <= exact_j + 1e-9 <= perseus_j + 2e-9
        assert row["gap_pct"] == pytest.approx((perseus_j - exact_j) / exact_j * 100, abs=1e-9)
        assert float(row["gap_all_pct"]) >= float(row["gap_pct"]) - 1e-9


def test_deadline_below_t_min_is_infeasible() -> None:
    profile = synthetic_profile(2, 7)
    dag = build_dag("1f1b", 2, 2)
    t_min = FrontierSolver(dag, profile, SolverParams(UNIT_S, P_BLOCK_W)).t_min_quant
    assert exact_min_energy(dag, profile, UNIT_S, P_BLOCK_W, t_min - 1) is None
    assert exact_min_energy(dag, profile, UNIT_S, P_BLOCK_W, t_min - 1, option_space="all") is None
    at_min = exact_min_energy(dag, profile, UNIT_S, P_BLOCK_W, t_min)
    assert at_min is not None
    assert at_min.makespan_quant == t_min
    assert [
        r.deadline_quant for r in exact_frontier(dag, profile, UNIT_S, P_BLOCK_W, [t_min - 5, t_min])
    ] == [t_min]


def test_missing_highspy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "highspy", None)
    profile = synthetic_profile(2, 8)
    dag = build_dag("1f1b", 2, 2)
    with pytest.raises(PlanningError, match=r"highspy.*perseusd\[exact\]"):
        exact_min_energy(dag, profile, UNIT_S, P_BLOCK_W, 10_000)


def test_start_plan_with_unknown_clock_is_rejected() -> None:
    profile = synthetic_profile(2, 9, clocks_mhz=FEW_CLOCKS)
    dag = build_dag("1f1b", 2, 2)
    with pytest.raises(PlanningError, match="777 MHz"):
        exact_min_energy(
            dag, profile, UNIT_S, P_BLOCK_W, 10_000, start_clocks_mhz=[777] * dag.num_computations
        )

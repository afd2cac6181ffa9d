"""The carbon benchmark's model of the job (`benchmarks/bench_carbon.py`, its measured mode
`benchmarks/carbon_measured_cases.py`): each frontier point's and each power limit's iteration time and energy
on the job's DAG from the bundled measured profile, and the trace replayed over such choices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perseusd.gpu.sim_boards import load_board
from perseusd.planner.baselines import all_max
from perseusd.planner.bundled import BUNDLED_PROFILES, bundled_profile
from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.evaluate import longest_path_s
from perseusd.planner.solver import SolverParams, solve_frontier
from perseusd.workload.sim_costs import WorkloadCosts

CASES: dict[str, tuple[str, int, int, float]] = {
    "a100x12": ("a100_sxm", 8, 12, 0.001),
    "h100x8": ("h100_sxm", 4, 8, 0.0002),
}
"""name -> (board = bundled profile, stages, microbatches, solver unit time s)."""
J_PER_KWH = 3.6e6
ETA_SWEEP = (0.5, 0.75, 0.9)
"""Weights beside Chase's 0.24, for context: how the choices move when energy weighs more."""


@dataclass(frozen=True)
class Choice:
    """One way to run an iteration: its time, energy and what it is (a point index or a power limit)."""

    label: str
    time_s: float
    energy_j: float


def job_at_all_max(name: str) -> tuple[ComputationDag, Choice]:
    """Case `name`'s 1F1B DAG and its all-max choice on the bundled profile (the baseline of every method)."""
    board, stages, microbatches, _unit_s = CASES[name]
    dag = build_dag("1f1b", stages, microbatches)
    reference = all_max(dag, bundled_profile(board), BUNDLED_PROFILES[board].p_block_w)
    return dag, Choice("all-max", reference.time_s, reference.energy_j)


def frontier_choices(dag: ComputationDag, board: str, unit_s: float) -> list[Choice]:
    profile = bundled_profile(board)
    params = SolverParams(unit_time_s=unit_s, p_block_w=BUNDLED_PROFILES[board].p_block_w)
    return [
        Choice(f"point {p.index}", p.refined_time_s or p.time_s, p.refined_energy_j)
        for p in solve_frontier(dag, profile, params)
    ]


def power_limit_choices(dag: ComputationDag, board_name: str, step_w: float) -> list[Choice]:
    """All-max clocks under each power limit of the sweep, capped by the board model."""
    board = load_board(board_name)
    if not board.power_capping:
        raise ValueError(f"the {board_name} board models no power capping: a limit would change nothing")
    costs = WorkloadCosts(bundled_profile(board_name), board)
    p_block_w = BUNDLED_PROFILES[board_name].p_block_w
    top_mhz = max(board.clocks_mhz)
    limits = []
    limit_w = board.power_limit_max_w
    while limit_w >= board.power_limit_min_w - 1e-9:
        limits.append(limit_w)
        limit_w -= step_w
    choices = []
    for limit_w in limits:
        runs = [
            costs.run_cost(dag.virtual_stage(n), c.instruction.value, top_mhz, limit_w).cost
            for n, c in enumerate(dag.computations)
        ]
        time_s = longest_path_s(dag, [r.time_s for r in runs])
        busy_s = sum(r.time_s for r in runs)
        energy_j = sum(r.energy_j for r in runs) + p_block_w * (dag.num_stages * time_s - busy_s)
        choices.append(Choice(f"{limit_w:g} W", time_s, energy_j))
    return choices


def replay(
    actual: Sequence[float],
    step_s: float,
    work: float,
    pick: Callable[[int], Choice],
) -> dict[str, Any]:
    """Run `work` iterations, interval by interval (`step_s` wall seconds each), `pick(i)` choosing how."""
    done = carbon_g = time_s = energy_j = 0.0
    labels: list[str] = []
    index = 0
    while done < work - 1e-9:
        choice = pick(index)
        iterations = min(work - done, step_s / choice.time_s)
        done += iterations
        time_s += iterations * choice.time_s
        energy_j += iterations * choice.energy_j
        carbon_g += iterations * choice.energy_j / J_PER_KWH * actual[index % len(actual)]
        labels.append(choice.label)
        index += 1
    return {
        "carbon_g": carbon_g,
        "time_s": time_s,
        "energy_j": energy_j,
        "intervals": index,
        "distinct_choices": len(set(labels)),
    }

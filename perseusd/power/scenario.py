"""One pipeline on one node under a power budget, three ways (offline, for the benchmark and `perseusctl cap
model`): a uniform power limit, one clock for all GPUs (ZeusGlobal-like), and the node cap's frontier-aware
allocation. Every way is replayed on the simulated board's cost model (`perseusd.power.replay`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perseusd.gpu.sim_boards import Board, load_board
from perseusd.planner.baselines import common_clocks_mhz
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.evaluate import all_max_clocks
from perseusd.planner.policy import PointSummary, Policy
from perseusd.planner.solver import FrontierPoint, SolverParams, solve_frontier
from perseusd.power.allocate import allocate
from perseusd.power.cap_inputs import GpuRange, JobLoad, candidate_indices
from perseusd.power.hard_line import TimeUnder, best_hard_line
from perseusd.power.limit_fit import PEAK_MARGIN
from perseusd.power.limit_model import LimitModel, LocalPipeline
from perseusd.power.replay import Replay, Setting, cap_point, iteration_time_s, replay
from perseusd.workload.sim_costs import WorkloadCosts

HARD_LINE_POINTS = 12
"""Frontier points the hard-line search tries (spread evenly in time)."""
SETTLE_S = 2.0
WINDOW_S = 1.0
MEASURED_S = 6.0
"""Replayed time after the settling, so that several windows are measured."""


@dataclass(frozen=True)
class Scenario:
    board: Board
    dag: ComputationDag
    costs: WorkloadCosts
    p_block_w: float
    points: tuple[FrontierPoint, ...]
    all_max_clocks: tuple[int, ...]
    all_max: Replay
    """All-max clocks under the default power limits: the baseline. Budgets are fractions of its worst
    window (the power a node must be provisioned for over the enforcement window)."""
    window_s: float = WINDOW_S

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(f"stage{s}" for s in range(self.dag.num_stages))

    @property
    def default_limits_w(self) -> tuple[float, ...]:
        return (self.board.power_limit_default_w,) * self.dag.num_stages

    @property
    def cap_at_s(self) -> float:
        return self.all_max.time_s / 2

    def run(self, setting: Setting) -> Replay:
        """`setting` from half-way through an all-max iteration (the cap set then), measured after."""
        before = Setting(self.all_max_clocks, self.default_limits_w)
        return replay(
            self.dag,
            self.costs,
            before,
            setting,
            self.p_block_w,
            cap_at_s=self.cap_at_s,
            act_s=self.board.power_limit_lower_s,
            horizon_s=self.cap_at_s + SETTLE_S + max(MEASURED_S, 3 * self.window_s),
            window_s=self.window_s,
            settle_s=SETTLE_S,
        )


def scenario_for(
    board_name: str, stages: int, microbatches: int, unit_time_s: float = 0.001, window_s: float = WINDOW_S
) -> Scenario:
    """The shipped board and profile of that name, a 1F1B pipeline, its frontier solved as the daemon does.

    A board without power-capping data (`a40`) gets the capping boards' behaviour (a computation over the
    limit runs at the highest clock that fits), so that power limits act at all."""
    board = dataclasses.replace(load_board(board_name), power_capping=True)
    profile = bundled_profile(board_name)
    dag = build_dag("1f1b", stages, microbatches, 1)
    costs = WorkloadCosts(profile, board)
    p_block_w = board.blocking_power_w
    points = tuple(solve_frontier(dag, profile, SolverParams(unit_time_s, p_block_w)))
    clocks = tuple(all_max_clocks(dag, profile))
    limits = (board.power_limit_default_w,) * stages
    base = replay(
        dag,
        costs,
        Setting(clocks, limits),
        Setting(clocks, limits),
        p_block_w,
        cap_at_s=0.0,
        act_s=0.0,
        horizon_s=SETTLE_S + max(MEASURED_S, 3 * window_s),
        window_s=window_s,
        settle_s=SETTLE_S,
    )
    return Scenario(board, dag, costs, p_block_w, points, clocks, base, window_s)


def uniform(scenario: Scenario, budget_w: float) -> tuple[Replay, dict[str, Any]]:
    """Every GPU limited to budget / GPUs (within the board's range), all-max clocks."""
    board = scenario.board
    limit_w = min(max(budget_w / scenario.dag.num_stages, board.power_limit_min_w), board.power_limit_max_w)
    result = scenario.run(Setting(scenario.all_max_clocks, (limit_w,) * scenario.dag.num_stages))
    return result, {"limit_w": round(limit_w, 2)}


def one_clock(scenario: Scenario, budget_w: float) -> tuple[Replay, dict[str, Any]]:
    """The highest clock, the same on every GPU, whose node power fits every window (default limits)."""
    clocks = sorted(common_clocks_mhz(scenario.dag, scenario.costs.profile), reverse=True)
    nodes = scenario.dag.num_computations
    result = None
    for clock in clocks:
        result = scenario.run(Setting((clock,) * nodes, scenario.default_limits_w))
        if result.worst_window_w <= budget_w:
            return result, {"clock_mhz": clock, "fits": True}
    assert result is not None
    return result, {"clock_mhz": clocks[-1], "fits": False}


def base_index(scenario: Scenario) -> int:
    """The point the default policy (`no_slowdown`) runs uncapped."""
    summaries = [
        PointSummary(p.index, p.refined_time_s or p.time_s, p.refined_energy_j) for p in scenario.points
    ]
    return Policy().choose(summaries, scenario.all_max.time_s).index


def limit_model(scenario: Scenario, clocks_mhz: Sequence[int]) -> LimitModel:
    """The pipeline at these clocks under per-stage limits, on the board's costs (every lower board clock)."""
    options = []
    for node, comp in enumerate(scenario.dag.computations):
        stage, instruction = scenario.dag.virtual_stage(node), comp.instruction.value
        lower = [c for c in scenario.board.clocks_mhz if c <= clocks_mhz[node]]
        costs = [scenario.costs.cost(stage, instruction, c) for c in lower]
        options.append([(c.time_s, c.power_w) for c in costs])
    pipeline = LocalPipeline(scenario.gpu_names)
    return LimitModel(scenario.dag, options, [pipeline], scenario.p_block_w, scenario.window_s)


def job_load(scenario: Scenario) -> JobLoad:
    points = tuple(
        cap_point(
            scenario.dag,
            scenario.costs,
            p.index,
            p.clocks_mhz,
            p.refined_time_s or p.time_s,
            scenario.p_block_w,
            scenario.gpu_names,
            scenario.window_s,
        )
        for p in scenario.points
    )
    clocks = {p.index: p.clocks_mhz for p in scenario.points}
    models: dict[int, LimitModel] = {}

    def model_at(index: int) -> LimitModel:
        if index not in models:
            models[index] = limit_model(scenario, clocks[index])
        return models[index]

    return JobLoad("job", 1, points, base_index(scenario), limit_model=model_at)


def frontier_cap(
    scenario: Scenario, budget_w: float, enforcement: str = "window", load: JobLoad | None = None
) -> tuple[Replay, dict[str, Any]]:
    """The node cap's allocation for one job on this node, replayed."""
    board = scenario.board
    ranges = [GpuRange(n, board.power_limit_min_w, board.power_limit_max_w) for n in scenario.gpu_names]
    allocation = allocate(ranges, [load or job_load(scenario)], budget_w, enforcement=enforcement)
    grant = allocation.jobs[0]
    point = next(p for p in scenario.points if p.index == grant.index)
    limits = tuple(allocation.limits_w[n] for n in scenario.gpu_names)
    result = scenario.run(Setting(point.clocks_mhz, limits))
    return result, {
        "point": grant.index,
        "planned_slowdown": round(grant.slowdown, 5),
        "planned_w": round(allocation.planned_w, 2),
        "limits_w": [round(w, 1) for w in limits],
        "limits_sum_w": round(sum(limits), 2),
        "strict": allocation.strict,
        "feasible": allocation.feasible,
    }


def hard_line(scenario: Scenario, budget_w: float, load: JobLoad) -> tuple[Replay, dict[str, Any]]:
    """The best split of the budget into per-GPU limits (summing to at most the budget) over a spread of
    frontier points, searched on the board's capping model (`perseusd.power.hard_line`), replayed."""
    board = scenario.board
    names = scenario.gpu_names
    ranges = [GpuRange(n, board.power_limit_min_w, board.power_limit_max_w) for n in names]
    by_index = {p.index: p for p in scenario.points}
    peaks = {p.index: p.peak_w for p in load.points}

    def timer(clocks: tuple[int, ...]) -> TimeUnder:
        def time_under(limits_w: dict[str, float]) -> float:
            setting = Setting(clocks, tuple(limits_w[n] for n in names))
            return iteration_time_s(scenario.dag, scenario.costs, setting, scenario.p_block_w)

        return time_under

    summaries = [
        PointSummary(p.index, p.refined_time_s or p.time_s, p.refined_energy_j) for p in scenario.points
    ]
    candidates = [
        (i, {n: w * PEAK_MARGIN for n, w in peaks[i].items()}, timer(by_index[i].clocks_mhz))
        for i in candidate_indices(summaries, HARD_LINE_POINTS)
        if i in peaks
    ]
    found = best_hard_line(ranges, candidates, budget_w)
    if found is None:
        limits = tuple(r.min_w for r in ranges)
        return scenario.run(Setting(scenario.all_max_clocks, limits)), {"point": None, "fits": False}
    limits = tuple(found.limits_w[n] for n in names)
    result = scenario.run(Setting(by_index[found.index].clocks_mhz, limits))
    return result, {
        "point": found.index,
        "limits_w": [round(w, 1) for w in limits],
        "limits_sum_w": round(found.sum_w, 2),
        "fits": True,
    }


def compare_at(scenario: Scenario, fraction: float) -> dict[str, Any]:
    """Every scheme at `fraction` of all-max power: slowdown and energy against all-max, power, windows."""
    budget_w = fraction * scenario.all_max.worst_window_w
    row: dict[str, Any] = {"budget_fraction": fraction, "budget_w": round(budget_w, 2)}
    load = job_load(scenario)
    schemes = {
        "uniform": uniform(scenario, budget_w),
        "one_clock": one_clock(scenario, budget_w),
        "perseusd": frontier_cap(scenario, budget_w, "window", load),
        "perseusd_strict": frontier_cap(scenario, budget_w, "strict", load),
        "hard_line": hard_line(scenario, budget_w, load),
    }
    base = scenario.all_max
    for name, (result, detail) in schemes.items():
        row[name] = {
            "slowdown": round(result.time_s / base.time_s - 1, 5),
            "energy_change": round(result.energy_j / base.energy_j - 1, 5),
            "time_s": round(result.time_s, 5),
            "energy_j": round(result.energy_j, 2),
            "mean_power_w": round(result.mean_power_w, 2),
            "worst_window_w": round(result.worst_window_w, 2),
            **detail,
        }
    return row

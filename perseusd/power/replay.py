"""Replaying a pipeline under a power cap on a simulated board's cost model: iteration time, energy and node
power over every enforcement window, for the benchmark and the analytic mode.

One pipeline, one GPU per stage, iterations back to back. Each computation's cost is the board's
(`WorkloadCosts.run_cost`, the code the simulated GPUs run): started at its planned clock under its GPU's
power limit *at its start*, it runs at the highest clock whose power fits. A GPU draws the computation's
power while computing and the blocking power otherwise.

A cap set at `cap_at_s` acts like the daemon's: the new power limits act `act_s` later (13 ms on the H100
board), the new plan from the first iteration that begins after the cap was set. Node power is the sum over
GPUs; its worst window is the highest average over any `window_s` that begins `settle_s` or more after the
cap was set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.planner.dag import ComputationDag
from perseusd.power.aliasing import max_window_energy_j, periodic_worst_window_w, schedule
from perseusd.power.allocate import stage_power_w
from perseusd.power.cap_inputs import CapPoint
from perseusd.workload.sim_costs import WorkloadCosts


@dataclass(frozen=True)
class Setting:
    """What the GPUs run: a clock per DAG node and a power limit per stage (W)."""

    clocks_mhz: tuple[int, ...]
    limits_w: tuple[float, ...]


@dataclass(frozen=True)
class Replay:
    time_s: float
    """Mean iteration time once the cap acts (iterations that began after it was set)."""
    energy_j: float
    """Mean energy per iteration over those iterations (every GPU of the pipeline)."""
    worst_window_w: float
    """The highest node power over any window beginning `settle_s` after the cap was set (W)."""
    mean_power_w: float


def cap_point(
    dag: ComputationDag,
    costs: WorkloadCosts,
    index: int,
    clocks_mhz: Sequence[int],
    time_s: float,
    p_block_w: float,
    gpu_names: Sequence[str],
    window_s: float = 1.0,
) -> CapPoint:
    """A frontier point as the node cap sees it, one GPU per stage (named `gpu_names[stage]`)."""
    per_stage: list[list[tuple[float, float]]] = [[] for _ in range(dag.num_stages)]
    durations, powers = [], []
    for node, comp in enumerate(dag.computations):
        cost = costs.cost(dag.virtual_stage(node), comp.instruction.value, clocks_mhz[node])
        per_stage[comp.stage].append((cost.time_s, cost.energy_j))
        durations.append(cost.time_s)
        powers.append(cost.power_w)
    stage_powers = [stage_power_w(c, time_s, p_block_w) for c in per_stage]
    period_s, segments = schedule(dag, durations, powers, p_block_w)
    flat = [segment for stage in segments for segment in stage]
    window_w = periodic_worst_window_w(flat, period_s, p_block_w * dag.num_stages, window_s)
    return CapPoint(
        index,
        time_s,
        {gpu_names[s]: stage_powers[s][0] for s in range(dag.num_stages)},
        {gpu_names[s]: stage_powers[s][1] for s in range(dag.num_stages)},
        window_w,
    )


def replay(
    dag: ComputationDag,
    costs: WorkloadCosts,
    before: Setting,
    after: Setting,
    p_block_w: float,
    *,
    cap_at_s: float,
    act_s: float,
    horizon_s: float,
    window_s: float = 1.0,
    settle_s: float = 2.0,
) -> Replay:
    """Run iterations until `horizon_s` (see the module)."""
    segments: list[tuple[float, float, float]] = []  # (start, end, power above blocking)
    start_s = 0.0
    capped: list[tuple[float, float]] = []  # (iteration time, energy) of iterations under the cap
    while start_s < horizon_s or len(capped) < 2:
        plan = after if start_s >= cap_at_s else before
        time_s, energy_j = _iteration(dag, costs, plan, after, start_s, cap_at_s + act_s, p_block_w, segments)
        if start_s >= cap_at_s:
            capped.append((time_s, energy_j))
        start_s += time_s
    end_s = start_s
    worst_w = _worst_window_w(segments, dag.num_stages * p_block_w, cap_at_s + settle_s, end_s, window_s)
    mean_t = sum(t for t, _ in capped) / len(capped)
    mean_e = sum(e for _, e in capped) / len(capped)
    return Replay(mean_t, mean_e, worst_w, mean_e / mean_t)


def iteration_time_s(dag: ComputationDag, costs: WorkloadCosts, setting: Setting, p_block_w: float) -> float:
    """One iteration's time under `setting` (its clocks under its limits, capped by the board)."""
    return _iteration(dag, costs, setting, setting, 0.0, 0.0, p_block_w, [])[0]


def _iteration(
    dag: ComputationDag,
    costs: WorkloadCosts,
    plan: Setting,
    after: Setting,
    start_s: float,
    limits_from_s: float,
    p_block_w: float,
    segments: list[tuple[float, float, float]],
) -> tuple[float, float]:
    finish = [0.0] * dag.num_computations
    busy_s = energy_j = 0.0
    for node in dag.topological_order:
        begin_s = max((finish[p] for p in dag.predecessors[node]), default=start_s)
        comp = dag.computations[node]
        limits = after.limits_w if begin_s >= limits_from_s else plan.limits_w
        run = costs.run_cost(
            dag.virtual_stage(node), comp.instruction.value, plan.clocks_mhz[node], limits[comp.stage]
        )
        finish[node] = begin_s + run.cost.time_s
        busy_s += run.cost.time_s
        energy_j += run.cost.energy_j
        segments.append((begin_s, finish[node], run.cost.power_w - p_block_w))
    time_s = max(finish) - start_s
    return time_s, energy_j + p_block_w * (dag.num_stages * time_s - busy_s)


def _worst_window_w(
    segments: Sequence[tuple[float, float, float]], base_w: float, from_s: float, to_s: float, window_s: float
) -> float:
    """The highest average node power over [t, t + window_s] for from_s <= t <= to_s - window_s."""
    if to_s - from_s < window_s:
        raise ValueError("the replay is shorter than settle + one window")
    return base_w + max_window_energy_j(segments, from_s, to_s - window_s, window_s) / window_s

"""How late each computation of a plan may end without delaying the iteration (its float, or slack).

A computation's slack is its latest finish minus its earliest finish in the plan's DAG (dependencies and
each GPU's order), with every computation taking its planned time. The daemon lowers a GPU's clock early
(before the end of the computation ahead of a lowered run) only where that computation has the slack to
run its last few milliseconds at the lower clock (`perseusd.switching.gpu_plan`).
"""

from __future__ import annotations

from collections.abc import Sequence

from perseusd.planner.dag import ComputationDag


def slack_s(dag: ComputationDag, times_s: Sequence[float]) -> list[float]:
    """Each computation's slack (s), by node id; `times_s` by node id."""
    count = dag.num_computations
    if len(times_s) != count:
        raise ValueError(f"{len(times_s)} times for a DAG of {count} computations")
    finish_s = dag.earliest_s(times_s)[1]
    makespan_s = max(finish_s, default=0.0)
    latest_finish_s = [makespan_s] * count
    for node in reversed(dag.topological_order):
        successors = dag.successors[node]
        if successors:
            latest_finish_s[node] = min(latest_finish_s[s] - times_s[s] for s in successors)
    return [max(0.0, latest_finish_s[n] - finish_s[n]) for n in range(count)]


def stage_slack_s(dag: ComputationDag, stage_times_s: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per stage (GPU), in its order, each computation's slack, from per-stage times in the same order."""
    times_s = [0.0] * dag.num_computations
    for order, stage_times in zip(dag.stage_orders, stage_times_s, strict=True):
        for node, time_s in zip(order, stage_times, strict=True):
            times_s[node] = time_s
    slack = slack_s(dag, times_s)
    return [[slack[node] for node in order] for order in dag.stage_orders]

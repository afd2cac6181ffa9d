"""The node's power ramp bound, for a job: each of the node's GPUs' slice of `ramp_bound_w_per_s` applied to
the plans the job deploys.

The bound and how it is held are `perseusd.planner.ramp_bound` (the plan's steps between computations within
the limit at every 10 ms sample; clocks only ever raised, so the iteration never slows). A node of N GPUs
holds every GPU's steps within bound / N alone (`bound_gpu_ramps`): whatever jobs, pipelines and stages its
GPUs run, and as GPUs join or leave a job, their sum holds the node's bound. A point is bounded once, over
all its stages (a job whose pipelines span nodes: every node with the same bound and GPU count computes the
same clocks). The deployed point's clocks and predicted energy are the bounded ones (`Job.plan_entries`,
`Job.plan_document`, the saving judged against the measurement); `ramp_note` says what the bound cost.
"""

from __future__ import annotations

import dataclasses
import logging

from perseusd.errors import PerseusError
from perseusd.jobs.job import Job
from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.ramp_bound import RampBounded, bound_gpu_ramps

logger = logging.getLogger(__name__)


def gpu_limit_w_per_s(node_limit_w_per_s: float, node_gpus: int) -> float:
    """Each GPU's slice of the node's bound (W/s)."""
    return node_limit_w_per_s / max(node_gpus, 1)


def bounded_rows(job: Job, index: int, gpu_limit_w_per_s: float) -> tuple[tuple[int, ...], ...] | None:
    """Point `index`'s clocks per stage (do-no-harm's safe clocks included) with every GPU's steps within
    `gpu_limit_w_per_s`, kept in `job.ramp_clocks` (None: no profile or frontier to bound it on)."""
    if index in job.ramp_clocks:
        return job.ramp_clocks[index]
    result = _bound(job, index, gpu_limit_w_per_s)
    if result is None:
        return None
    dag, bounded = result
    rows = tuple(tuple(bounded.clocks_mhz[n] for n in nodes) for nodes in dag.stage_orders)
    job.ramp_clocks[index] = rows
    return rows


def apply_ramp_bound(job: Job, node_limit_w_per_s: float, node_gpus: int) -> None:
    """Bound the deployed point's ramps (after do-no-harm); its predicted energy is the bounded plan's."""
    job.ramp_clocks, job.ramp_note = {}, ""
    deployed = job.deployed
    if not node_limit_w_per_s > 0 or deployed is None or job.profile is None:
        return
    index = deployed.point.index
    gpu_limit = gpu_limit_w_per_s(node_limit_w_per_s, node_gpus)
    placed = _planned(job, index)
    result = _bound(job, index, gpu_limit)
    if placed is None or result is None:
        return
    dag, planned = placed
    _dag, bounded = result
    job.ramp_clocks[index] = tuple(tuple(bounded.clocks_mhz[n] for n in nodes) for nodes in dag.stage_orders)
    job.ramp_note = _note(bounded, node_limit_w_per_s, gpu_limit)
    if bounded.raised:
        cost_j = (
            evaluate_clocks(dag, job.profile, bounded.clocks_mhz, job.p_block_w).energy_j
            - evaluate_clocks(dag, job.profile, planned, job.p_block_w).energy_j
        )
        point = dataclasses.replace(deployed.point, energy_j=deployed.point.energy_j + cost_j)
        job.deployed = dataclasses.replace(deployed, point=point)
        job.ramp_note += f", {bounded.raised} computation(s) raised, costs {cost_j:.1f} J per iteration"
    if not bounded.met:
        logger.warning("job %s: %s", job.name, job.ramp_note)
    else:
        logger.info("job %s: %s", job.name, job.ramp_note)


def _bound(job: Job, index: int, gpu_limit_w_per_s: float) -> tuple[ComputationDag, RampBounded] | None:
    placed = _planned(job, index)
    if placed is None or job.profile is None:
        return None
    dag, clocks = placed
    try:
        return dag, bound_gpu_ramps(dag, job.profile, clocks, gpu_limit_w_per_s)
    except (PerseusError, ValueError) as exc:
        logger.warning("job %s: cannot bound its plan's power ramps (%s); it runs as planned", job.name, exc)
        return None


def _planned(job: Job, index: int) -> tuple[ComputationDag, list[int]] | None:
    """Point `index` as its DAG and a clock per node as `Job.plan_entries` deploys it before any bound."""
    placed = job.node_clocks(index)
    if placed is None:
        return None
    dag, clocks = placed
    cached = job.ramp_clocks.pop(index, None)
    for stage, nodes in enumerate(dag.stage_orders):
        for node, entry in zip(nodes, job.plan_entries(stage, index), strict=True):
            clocks[node] = entry.freq_mhz
    if cached is not None:
        job.ramp_clocks[index] = cached
    return dag, clocks


def _note(bounded: RampBounded, node_limit_w_per_s: float, gpu_limit_w_per_s: float) -> str:
    held = "held" if bounded.met else "NOT met (a GPU's steps at all-max clocks exceed its slice)"
    return (
        f"ramp bound {node_limit_w_per_s / 1000:.1f} kW/s ({gpu_limit_w_per_s / 1000:.1f} per GPU) {held}: "
        f"the largest GPU's steps {bounded.planned_ramp_w_per_s / 1000:.1f} -> "
        f"{bounded.ramp_w_per_s / 1000:.1f} kW/s"
    )

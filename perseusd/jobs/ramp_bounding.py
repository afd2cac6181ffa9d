"""The node's power ramp bound, for a job: its share of `ramp_bound_w_per_s` applied to the plans it deploys.

The bound and how it is held are `perseusd.planner.ramp_bound` (the plan's steps between computations, summed
over the node's GPUs, within the limit at every 10 ms sample; clocks only ever raised, so the iteration never
slows). A job is held to the node's bound times its share of the node's GPUs (the jobs on a node then stay
within the bound together), over the stages it runs here (a job whose pipelines span nodes: each node bounds
its own). The deployed point's clocks and predicted energy are the bounded ones (`Job.plan_entries`,
`Job.plan_document`, the saving judged against the measurement); `plan_note` says what the bound cost.
"""

from __future__ import annotations

import dataclasses
import logging

from perseusd.errors import PerseusError
from perseusd.jobs.job import Job
from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.ramp_bound import bound_ramps

logger = logging.getLogger(__name__)


def job_limit_w_per_s(node_limit_w_per_s: float, job: Job, node_gpus: int) -> float:
    """The job's share of the node's bound (W/s): the bound times its GPUs here / the node's GPUs."""
    return node_limit_w_per_s * len(job.slots) / max(node_gpus, len(job.slots), 1)


def bounded_rows(job: Job, index: int, limit_w_per_s: float) -> tuple[tuple[int, ...], ...] | None:
    """Point `index`'s clocks per stage (do-no-harm's safe clocks included) with the job's ramp bound
    applied, kept in `job.ramp_clocks` (None: no profile or frontier to bound it on)."""
    if index in job.ramp_clocks:
        return job.ramp_clocks[index]
    placed = _planned(job, index)
    if placed is None or job.profile is None:
        return None
    dag, clocks = placed
    per_stage = [0] * dag.num_stages
    for slot in job.slots.values():
        per_stage[slot.stage] += 1
    try:
        result = bound_ramps(dag, job.profile, clocks, limit_w_per_s, per_stage)
    except (PerseusError, ValueError) as exc:
        logger.warning("job %s: cannot bound its plan's power ramps (%s); it runs as planned", job.name, exc)
        return None
    rows = tuple(tuple(result.clocks_mhz[n] for n in nodes) for nodes in dag.stage_orders)
    job.ramp_clocks[index] = rows
    if index == (job.deployed.point.index if job.deployed else None):
        job.ramp_note = _note(result.planned_ramp_w_per_s, result.ramp_w_per_s, limit_w_per_s, result.met)
        job.ramp_note += f", {result.raised} computation(s) raised" if result.raised else ""
        if not result.met:
            logger.warning("job %s: %s", job.name, job.ramp_note)
    return rows


def apply_ramp_bound(job: Job, node_limit_w_per_s: float, node_gpus: int) -> None:
    """Bound the deployed point's ramps (after do-no-harm); its predicted energy is the bounded plan's."""
    job.ramp_clocks, job.ramp_note = {}, ""
    deployed = job.deployed
    if not node_limit_w_per_s > 0 or deployed is None or job.profile is None:
        return
    index = deployed.point.index
    placed = _planned(job, index)
    rows = bounded_rows(job, index, job_limit_w_per_s(node_limit_w_per_s, job, node_gpus))
    if rows is None or placed is None:
        return
    dag, planned = placed
    bounded = [0] * dag.num_computations
    for nodes, row in zip(dag.stage_orders, rows, strict=True):
        for node, clock in zip(nodes, row, strict=True):
            bounded[node] = clock
    if planned == bounded:
        return
    cost_j = (
        evaluate_clocks(dag, job.profile, bounded, job.p_block_w).energy_j
        - evaluate_clocks(dag, job.profile, planned, job.p_block_w).energy_j
    )
    point = dataclasses.replace(deployed.point, energy_j=deployed.point.energy_j + cost_j)
    job.deployed = dataclasses.replace(deployed, point=point)
    job.ramp_note += f", costs {cost_j:.1f} J per iteration"
    logger.info("job %s: %s", job.name, job.ramp_note)


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


def _note(planned_w_per_s: float, ramp_w_per_s: float, limit_w_per_s: float, met: bool) -> str:
    held = "held" if met else "NOT met (the plan's steps at all-max clocks exceed it)"
    return (
        f"ramp bound {limit_w_per_s / 1000:.1f} kW/s {held}: the plan's steps "
        f"{planned_w_per_s / 1000:.1f} -> {ramp_w_per_s / 1000:.1f} kW/s"
    )

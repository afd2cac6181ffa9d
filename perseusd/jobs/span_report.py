"""A spanning job as `perseusctl jobs` shows it on any of its nodes: every node's part, the leader, the plan,
the whole job's measured energy, and what this node cannot see."""

from __future__ import annotations

import dataclasses

from perseus_client.protocol import PipelineInfo, ProfilingInfo, SpanInfo, SpanMember

from perseusd.cluster.span_board import MemberRecord
from perseusd.jobs.job import Job
from perseusd.jobs.span_members import members_of, missing_text, ranges
from perseusd.jobs.span_state import SpanState
from perseusd.jobs.states import PROFILING


def span_info(job: Job) -> SpanInfo | None:
    state = job.span
    if state is None:
        return None
    members = members_of(job, state, None)
    plan = state.plan
    return SpanInfo(
        node=state.node,
        leader=(state.view.leader or "") if state.view is not None else "",
        members=tuple(_member(m) for _, m in sorted(members.items())),
        missing=_missing(job, state, members),
        view=state.view_state,
        solves=plan.solves if plan is not None else 0,
        plan_epoch=plan.epoch if plan is not None else 0,
        measured_energy_j=_total([m.measured_j for m in members.values()]),
        measured_all_max_energy_j=_total([m.measured_all_max_j for m in members.values()]),
    )


def _member(member: MemberRecord) -> SpanMember:
    return SpanMember(
        node=member.node,
        stages=slots_text(member.slots),
        state=member.state,
        profiling_iterations=member.profiling_iterations,
        measured_energy_j=member.measured_j,
        measured_all_max_energy_j=member.measured_all_max_j,
    )


def slots_text(slots: tuple[tuple[int, int], ...]) -> str:
    """`p0:s0-3 p1:s4`."""
    by_pipeline: dict[int, list[int]] = {}
    for pipeline, stage in slots:
        by_pipeline.setdefault(pipeline, []).append(stage)
    return " ".join(f"p{p}:s{ranges(sorted(stages))}" for p, stages in sorted(by_pipeline.items()))


def _missing(job: Job, state: SpanState, members: dict[str, MemberRecord]) -> str:
    parts = [text] if (text := missing_text(job, members)) else []
    if state.view_state != "fresh":
        parts.append(f"cluster view {state.view_state}: plans keep running, re-plans wait for etcd")
    if state.view is not None and state.view.leader is None:
        parts.append("no node leads the job now (another takes over within the lease TTL)")
    return "; ".join(parts)


def _total(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else round(sum(v for v in values if v), 3)


def span_pipelines(job: Job, local: list[PipelineInfo]) -> tuple[PipelineInfo, ...]:
    """Every pipeline of the job: this node's with its measurements, the others from their nodes' records."""
    state = job.span
    assert state is not None
    members = members_of(job, state, None)
    stages: dict[int, set[int]] = {}
    nodes: dict[int, set[str]] = {}
    for member in members.values():
        for pipeline, stage in member.slots:
            stages.setdefault(pipeline, set()).add(stage)
            nodes.setdefault(pipeline, set()).add(member.node)
    by_index = {info.pipeline: info for info in local}
    infos = []
    for pipeline in sorted(stages):
        info = by_index.get(pipeline)
        entry = state.plan.point_for(pipeline) if state.plan is not None else None
        plan_index = entry.point if entry is not None else (state.plan.base if state.plan else None)
        point = job.point(plan_index)
        registered, where = len(stages[pipeline]), ",".join(sorted(nodes[pipeline]))
        if info is not None:
            infos.append(dataclasses.replace(info, stages_registered=registered, node=where))
            continue
        infos.append(
            PipelineInfo(
                pipeline=pipeline,
                stages_registered=registered,
                iterations=0,
                iteration_time_s=None,
                compute_time_s=None,
                plan_index=plan_index if point is not None else None,
                plan_time_s=point.time_s if point is not None else None,
                plan_since_step=None,
                slowness=None,
                node=where,
            )
        )
    return tuple(infos)


def span_profiling(job: Job, local: ProfilingInfo | None) -> ProfilingInfo | None:
    """While the job profiles: the iterations of its slowest node (its profiling ends with that node's)."""
    state = job.span
    if state is None or job.state != PROFILING:
        return local
    members = members_of(job, state, None)
    iterations = max((m.profiling_iterations for m in members.values()), default=0)
    if local is None:
        return ProfilingInfo(iterations, 0, 0, 0.0)
    return ProfilingInfo(
        max(iterations, local.iterations), local.clocks_done, local.clocks_total, local.energy_j
    )

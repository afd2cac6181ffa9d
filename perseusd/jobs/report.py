"""Jobs as the protocol shows them (`JobInfo`), and the documents a user reads back."""

from __future__ import annotations

import json
import time

from perseus_client.protocol import JobInfo, PipelineInfo, ProfilingInfo

from perseusd.daemon.plans import PlanBook
from perseusd.jobs.job import PROFILING, Job
from perseusd.jobs.slot import StageSlot


def job_info(job: Job, plans: PlanBook) -> JobInfo:
    deployed = job.deployed
    changes, late, begins, steps = 0, 0, 0, 0
    for slot in job.slots.values():
        plan = plans.get(slot.gpu)
        if plan is not None:
            changes += plan.clock_changes
            late += plan.late
            begins += plan.begins
            steps += slot.running_steps
    iterations = steps / len(job.slots) if job.slots else 0
    return JobInfo(
        job=job.name,
        uid=job.uid,
        state=job.state,
        state_for_s=round(max(0.0, time.monotonic() - job.state_since_s), 3),
        schedule=job.shape.schedule,
        num_stages=job.shape.num_stages,
        num_microbatches=job.shape.num_microbatches,
        chunks=job.shape.chunks,
        pipelines=tuple(_pipeline(p, slots) for p, slots in job.pipelines().items()),
        policy=job.policy.name,
        target=job.policy.target,
        cached=job.cached,
        profiling=_profiling(job),
        frontier_points=len(job.points),
        plan_index=deployed.point.index if deployed else None,
        plan_time_s=deployed.point.time_s if deployed else None,
        plan_energy_j=deployed.point.energy_j if deployed else None,
        fastest_time_s=deployed.fastest.time_s if deployed else None,
        clock_changes_per_iteration=round(changes / len(job.slots) / iterations, 3) if iterations else None,
        wrong_clock_fraction=round(late / begins, 5) if begins else None,
        error=job.error,
    )


def _pipeline(pipeline: int, slots: list[StageSlot]) -> PipelineInfo:
    first = min(slots, key=lambda s: s.stage)
    mean_s = first.mean_iteration_time_s()
    return PipelineInfo(
        pipeline=pipeline,
        stages_registered=len(slots),
        iterations=max(s.steps_done for s in slots),
        iteration_time_s=round(mean_s, 6) if mean_s is not None else None,
    )


def _profiling(job: Job) -> ProfilingInfo | None:
    sweeps = [s.sweep for s in job.profiling_slots() if s.sweep is not None]
    if sweeps and job.state == PROFILING:
        return ProfilingInfo(
            iterations=max(s.steps_done for s in job.slots.values()),
            clocks_done=min(sw.clocks_done for sw in sweeps),
            clocks_total=max(sw.clocks_total for sw in sweeps),
            energy_j=0.0,
        )
    if job.profiling_iterations and job.profile is not None:
        clocks = len(job.profile.frequencies_mhz())
        return ProfilingInfo(job.profiling_iterations, clocks, clocks, round(job.profiling_energy_j, 3))
    return None


def document_text(doc: dict[str, object]) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)

"""Jobs as the protocol shows them (`JobInfo`), and the documents a user reads back."""

from __future__ import annotations

import json
import time

from perseus_client.protocol import (
    CarbonInfo,
    JobInfo,
    PipelineInfo,
    PlanningInfo,
    ProfilingInfo,
    StragglerInfo,
)

from perseusd.cluster.job_board import PipelineFacts
from perseusd.jobs.job import Job
from perseusd.jobs.metering import MeasuredSaving
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.span_report import span_info, span_pipelines, span_profiling
from perseusd.jobs.states import PROFILING
from perseusd.jobs.straggling import target_time_s
from perseusd.switching.plans import PlanBook


def job_info(
    job: Job,
    plans: PlanBook,
    measured: MeasuredSaving | None = None,
    carbon: CarbonInfo | None = None,
    profiling_j: float | None = None,
) -> JobInfo:
    """The job as `perseusctl jobs` shows it; `measured`: its energy as the counters measured it;
    `profiling_j`: what its GPUs used so far while it profiles (counters).

    "Saved vs all-max" is measured (counters: all-max during profiling's first clock, the plan while it runs)
    where the daemon measured both, else predicted from the profile; `energy_saved_source` says which.
    """
    deployed = job.deployed
    saved_j = None if measured is None else measured.saved_j
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
        pipelines=_pipelines(job) if job.span is None else span_pipelines(job, list(_pipelines(job))),
        policy=job.policy.name,
        target=job.policy.target,
        cached=job.cached,
        profiling=span_profiling(job, _profiling(job, profiling_j)),
        frontier_points=len(job.points),
        plan_index=deployed.point.index if deployed else None,
        plan_time_s=deployed.point.time_s if deployed else None,
        plan_energy_j=deployed.point.energy_j if deployed else None,
        fastest_time_s=deployed.fastest.time_s if deployed else None,
        clock_changes_per_iteration=round(changes / len(job.slots) / iterations, 3) if iterations else None,
        wrong_clock_fraction=round(late / begins, 5) if begins else None,
        error=job.error,
        straggler=_straggler(job),
        target_time_s=_round(target_time_s(job.straggler, deployed.fastest if deployed else None)),
        all_max_time_s=job.all_max.time_s if job.all_max else None,
        all_max_energy_j=job.all_max.energy_j if job.all_max else None,
        energy_saved_j=round(job.energy_saved_j if saved_j is None else saved_j, 3),
        cluster=job.remote.state if job.remote is not None else "",
        energy_saved_source=_saved_source(job, saved_j),
        measured_energy_j=_round(measured.running_j, 3) if measured is not None else None,
        measured_all_max_energy_j=_round(measured.all_max_j, 3) if measured is not None else None,
        carbon=carbon,
        plan_note="; ".join(note for note in (job.plan_note, job.ramp_note, job.departure) if note),
        planning=_planning(job),
        stage_gpus=job.shape.stage_gpus,
        span=span_info(job),
        profile_error_pct=_round(job.accuracy.profile_error_pct, 3),
        predicted_saving_pct=_predicted_saving_pct(job),
        measured_saving_pct=job.accuracy.measured_saving_pct,
        saving_error_pts=job.accuracy.error_pts,
        accuracy_action=job.accuracy.action,
    )


def _predicted_saving_pct(job: Job) -> float | None:
    if job.deployed is None or job.all_max is None or job.all_max.energy_j <= 0:
        return None
    return round(100.0 * (1.0 - job.deployed.point.energy_j / job.all_max.energy_j), 3)


def _planning(job: Job) -> PlanningInfo | None:
    times = job.planning
    if times is None:
        return None
    p = times.phases
    return PlanningInfo(
        *(
            round(v, 6)
            for v in (times.total_s, p.fit_s, p.frontier_s, p.follow_s, p.descent_s, times.transfer_s)
        )
    )


def _saved_source(job: Job, measured_saved_j: float | None) -> str:
    if measured_saved_j is not None:
        return "measured"
    return "predicted" if job.deployed is not None and job.all_max is not None else ""


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _straggler(job: Job) -> StragglerInfo | None:
    s = job.straggler
    return None if s is None else StragglerInfo(s.pipeline, round(s.factor, 4), s.source, s.since_step)


def _pipelines(job: Job) -> tuple[PipelineInfo, ...]:
    local = [_pipeline(job, p, slots) for p, slots in job.pipelines().items()]
    remote = job.remote.pipelines if job.remote is not None else {}
    others = [_remote(p, facts) for p, facts in remote.items() if p not in job.runs]
    return tuple(sorted(local + others, key=lambda info: info.pipeline))


def _pipeline(job: Job, pipeline: int, slots: list[StageSlot]) -> PipelineInfo:
    first = min(slots, key=lambda s: s.stage)
    mean_s = first.mean_iteration_time_s()
    run = job.runs.get(pipeline)
    point = job.point(run.point_index) if run is not None else None
    compute_s = run.compute_time_s() if run is not None else None
    return PipelineInfo(
        pipeline=pipeline,
        stages_registered=len(slots),
        iterations=max(s.steps_done for s in slots),
        iteration_time_s=_round(mean_s),
        compute_time_s=_round(compute_s),
        plan_index=point.index if point is not None else None,
        plan_time_s=point.time_s if point is not None else None,
        plan_since_step=run.plan_since_step if run is not None and point is not None else None,
        slowness=_round(compute_s / point.time_s, 4) if compute_s and point and point.time_s > 0 else None,
        node="",
    )


def _remote(pipeline: int, facts: PipelineFacts) -> PipelineInfo:
    return PipelineInfo(
        pipeline=pipeline,
        stages_registered=0,
        iterations=0,
        iteration_time_s=None,
        compute_time_s=facts.iteration_time_s,
        plan_index=None,
        plan_time_s=facts.planned_time_s,
        plan_since_step=None,
        slowness=round(facts.slowness, 4),
        node=facts.node,
    )


def _profiling(job: Job, profiling_j: float | None) -> ProfilingInfo | None:
    """Profiling's progress and the energy it used, measured by the counters: so far while it runs, in
    total once done (also when it ended in a failure)."""
    sweeps = [s.sweep for s in job.profiling_slots() if s.sweep is not None]
    if sweeps and job.state == PROFILING:
        return ProfilingInfo(
            iterations=max(s.steps_done for s in job.slots.values()),
            clocks_done=min(sw.clocks_done for sw in sweeps),
            clocks_total=max(sw.clocks_total for sw in sweeps),
            energy_j=round(profiling_j or 0.0, 3),
        )
    if job.profiling_iterations and (job.profile is not None or job.profiling_energy_j):
        clocks = len(job.profile.frequencies_mhz()) if job.profile is not None else 0
        return ProfilingInfo(job.profiling_iterations, clocks, clocks, round(job.profiling_energy_j, 3))
    return None


def document_text(doc: dict[str, object]) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)

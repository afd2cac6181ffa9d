"""Per-job and per-pipeline metrics, from the job manager's jobs as `perseusctl jobs` shows them.

Cardinality is bounded: at most `MAX_JOBS` jobs (the manager keeps few ended ones) and `MAX_PIPELINES`
pipelines per job; what is left out is counted in `perseus_metrics_series_omitted`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from perseus_client.message import JOB_STATES
from perseus_client.protocol import JobInfo
from prometheus_client.core import Metric

from perseusd.jobs.job import Job
from perseusd.jobs.manager import JobManager
from perseusd.jobs.metering import MeasuredSaving
from perseusd.jobs.report import job_info
from perseusd.jobs.response import DEPARTS
from perseusd.metrics.families import add_known, add_state_set, counter, gauge
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)

MAX_JOBS = 64
MAX_PIPELINES = 64
# Not "job": Prometheus gives every series a `job` label of its own (the scrape job).
JOB = ("job_name", "uid")
PIPELINE = ("job_name", "uid", "pipeline")


def job_snapshots(manager: JobManager, plans: PlanBook) -> tuple[list[tuple[JobInfo, int, int]], int]:
    """(info, clock changes, wrong-clock starts) of each exported job, and how many jobs were left out.

    Runs on the scrape thread while the main loop may change a job: a job that changes under the read is
    retried once and otherwise skipped for this scrape (its counters are cumulative, nothing is lost)."""
    jobs = list(manager.jobs.values())
    snapshots = []
    for job in jobs[:MAX_JOBS]:
        for _attempt in range(2):
            try:
                snapshots.append(_snapshot(job, plans, manager.measured(job)))
                break
            except RuntimeError as exc:  # a dict changed size during iteration
                logger.debug("job %s changed while scraped: %s", job.name, exc)
    return snapshots, max(0, len(jobs) - MAX_JOBS)


def _snapshot(job: Job, plans: PlanBook, measured: MeasuredSaving | None) -> tuple[JobInfo, int, int]:
    changes, late = 0, 0
    for slot in list(job.slots.values()):
        plan = plans.get(slot.gpu)
        if plan is not None:
            changes += plan.clock_changes
            late += plan.late
    return job_info(job, plans, measured), changes, late


def job_families(snapshots: list[tuple[JobInfo, int, int]]) -> Iterator[Metric]:
    state = gauge("job_state", "1 for the job's current state, 0 for the others", (*JOB, "state"))
    plan_time = gauge("job_plan_iteration_time_seconds", "Deployed point's predicted iteration time", JOB)
    plan_energy = gauge(
        "job_plan_iteration_energy_joules", "Deployed point's predicted iteration energy", JOB
    )
    max_time = gauge("job_all_max_iteration_time_seconds", "Predicted iteration time at all-max clocks", JOB)
    max_energy = gauge("job_all_max_iteration_energy_joules", "Predicted iteration energy, all-max", JOB)
    saved = gauge(
        "job_energy_saved_joules",
        "Energy saved versus all-max clocks since the plan runs; basis: measured (the counters, both "
        "the plan and all-max) or predicted (the profile's figures): sum only basis=measured as a fact",
        (*JOB, "basis"),
    )
    departs = gauge(
        "job_plan_departs",
        "1 when the running plan's measured iteration time departs from its prediction (the profile does not "
        "hold for this run; predicted savings stop accruing)",
        JOB,
    )
    changes = counter("job_clock_changes", "SM clock changes made by the job's plans", JOB)
    late = counter("job_wrong_clock_starts", "Computations that began before their planned clock", JOB)
    straggling = gauge("job_straggler_factor", "Slowdown factor of the job's straggler pipeline", PIPELINE)
    iteration = gauge("pipeline_iteration_time_seconds", "Mean measured iteration time", PIPELINE)
    iterations = counter("pipeline_iterations", "Iterations measured", PIPELINE)
    slowness = gauge("pipeline_slowness_ratio", "Compute time over the plan's time (1: on plan)", PIPELINE)
    planning = gauge(
        "job_planning_seconds",
        "Profiling done to plan deployed, by phase (fit, frontier, follow, descent, transfer; total)",
        (*JOB, "phase"),
    )
    accuracy = gauge(
        "job_saving_percent",
        "The running plan's saving versus all-max: predicted, measured, how far it may lie (error_points)",
        (*JOB, "kind"),
    )
    profile_error = gauge(
        "job_profile_error_percent", "RMS relative standard error of the profile's energies", JOB
    )
    for info, clock_changes, wrong_starts in snapshots:
        key = [info.job, str(info.uid)]
        add_state_set(state, key, JOB_STATES, info.state)
        add_known(plan_time, key, info.plan_time_s)
        add_known(plan_energy, key, info.plan_energy_j)
        add_known(max_time, key, info.all_max_time_s)
        add_known(max_energy, key, info.all_max_energy_j)
        saved.add_metric([*key, info.energy_saved_source or "predicted"], info.energy_saved_j)
        departs.add_metric(key, 1.0 if DEPARTS in info.plan_note else 0.0)
        changes.add_metric(key, clock_changes)
        late.add_metric(key, wrong_starts)
        if info.straggler is not None:
            straggling.add_metric([*key, str(info.straggler.pipeline)], info.straggler.factor)
        add_known(profile_error, key, info.profile_error_pct)
        for kind, value in (
            ("predicted", info.predicted_saving_pct),
            ("measured", info.measured_saving_pct),
            ("error_points", info.saving_error_pts),
        ):
            add_known(accuracy, [*key, kind], value)
        for phase, seconds in planning_phases(info):
            planning.add_metric([*key, phase], seconds)
        for pipe in info.pipelines[:MAX_PIPELINES]:
            pkey = [*key, str(pipe.pipeline)]
            add_known(iteration, pkey, pipe.iteration_time_s)
            if not pipe.node:  # this node's pipelines only (others are the other nodes' metrics)
                iterations.add_metric(pkey, pipe.iterations)
            add_known(slowness, pkey, pipe.slowness)
    yield from (
        state,
        plan_time,
        plan_energy,
        max_time,
        max_energy,
        saved,
        departs,
        changes,
        late,
        straggling,
    )
    yield from (iteration, iterations, slowness, planning, accuracy, profile_error)


def planning_phases(info: JobInfo) -> list[tuple[str, float]]:
    """(phase, seconds) of the job's planning, "total" last; none before its plan was deployed."""
    p = info.planning
    if p is None:
        return []
    phases = (p.fit_s, p.frontier_s, p.follow_s, p.descent_s, p.transfer_s, p.total_s)
    return list(zip(("fit", "frontier", "follow", "descent", "transfer", "total"), phases, strict=True))

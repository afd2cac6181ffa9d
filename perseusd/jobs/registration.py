"""Registration: what a registration must satisfy to create or join a job, and what it creates.

The job manager (`perseusd.jobs.manager`) keeps the node's jobs and calls these when a training process
registers a GPU (`register`) and when a job's last GPU leaves (`ended_why`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from perseus_client.protocol import Register

from perseusd.errors import InvalidValueError, JobOwnerError
from perseusd.gpu.backend import GpuInfo
from perseusd.jobs.cache import JobCache
from perseusd.jobs.job import Job
from perseusd.jobs.observed import OrderLearner
from perseusd.jobs.shape import JobShape, signature
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.states import PROFILING, REGISTERED, SOLVING
from perseusd.planner.policy import Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingImport:
    """A profile imported for a job its user has not registered yet."""

    profile: Profile
    p_block_w: float
    waiting_w: WaitingPoints = ()
    """The waiting power by held clock the file gave (its `waiting_power` column; empty: none)."""


def check_size(shape: JobShape, limit: int) -> None:
    """Refuse a shape of more than `limit` computations (`max_job_computations`)."""
    if shape.computations > limit:
        raise InvalidValueError(
            f"{shape.describe()} has {shape.computations} computations (stages x microbatches x chunks "
            f"x 2); this daemon plans at most {limit} (max_job_computations)",
            "",
        )


def check_joins(job: Job, uid: int, shape: JobShape, message: Register) -> None:
    """Refuse a registration that cannot join `job`: another user's, another shape or run, a full stage."""
    if job.uid != uid:
        raise JobOwnerError(job.name)
    if job.shape != shape:
        raise InvalidValueError(f"job {job.name} is {job.shape.describe()}, not {shape.describe()}")
    if job.run != message.run:
        raise InvalidValueError(f"job {job.name} is run {job.run!r}, not {message.run!r}: another run")
    group = [s.gpu for s in job.stage_group(message.pipeline, message.stage) if s.gpu != message.gpu]
    if len(group) >= shape.stage_gpus:
        gpus = f"{shape.stage_gpus} GPU(s) per stage" if shape.stage_gpus > 1 else "one GPU per stage"
        raise InvalidValueError(
            f"pipeline {message.pipeline} stage {message.stage} of job {job.name} runs on "
            f"{', '.join(group)} ({gpus}; give stage_gpus for tensor parallelism)",
        )


def new_job(
    message: Register,
    uid: int,
    shape: JobShape,
    gpu_name: str,
    policy: Policy,
    pending_imports: dict[tuple[int, str], PendingImport],
    cache: JobCache | None,
) -> tuple[Job, bool]:
    """A new job for `message`, with the profile its user imported before (True: it was imported, to be
    stored) or else what the cache holds for its signature (its profile, and its frontier if solved)."""
    name, run = message.job, message.run
    job = Job(name, uid, shape, gpu_name, signature(name, uid, shape, gpu_name), policy, run)
    imported = pending_imports.pop((uid, name), None)
    if imported is not None:
        job.profile, job.p_block_w, job.waiting_w = imported.profile, imported.p_block_w, imported.waiting_w
    elif cache is not None:
        entry = cache.load(job.signature, shape)
        if entry is not None:
            job.profile, job.p_block_w, job.cached = entry.profile, entry.p_block_w, True
            job.waiting_w = entry.waiting_w
            if entry.frontier is not None:
                job.set_frontier(entry.frontier)
            job.cached_frontier_file = entry.frontier_file
    logger.info("job %s (uid %d, %s) registered%s", name, uid, shape.describe(), " from cache" * job.cached)
    return job, imported is not None


def new_slot(message: Register, pid: int, shape: JobShape, info: GpuInfo) -> StageSlot:
    """The place of the registering GPU in its job."""
    return StageSlot(
        gpu=message.gpu,
        pipeline=message.pipeline,
        stage=message.stage,
        pid=pid,
        num_stages=shape.num_stages,
        learner=OrderLearner(shape.num_microbatches, shape.chunks),
        supported_clocks_mhz=info.supported_sm_clocks_mhz,
    )


def ended_why(job: Job, last: StageSlot | None) -> str:
    """Why a job ended early when its last GPU (`last`) left, for `perseusctl jobs` and the log; "" for a job
    that ended while running its plan (the normal end of training, which needs no explanation)."""
    if job.state == PROFILING:
        done = last.profiling_steps if last is not None else 0
        return (
            "its last GPU left while it was profiling (after "
            f"{done or 'no'} measured iteration(s)); nothing was solved: run it longer, or import a profile"
        )
    if job.state == REGISTERED:
        return "its last GPU left before every stage of a pipeline registered"
    if job.state == SOLVING:
        return "its last GPU left while its frontier was being solved"
    return ""

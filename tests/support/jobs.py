"""A job built in process for the jobs tests: one GPU per stage of pipeline 0, named `GPU-<stage>`."""

from __future__ import annotations

from collections.abc import Sequence

from perseusd.jobs.job import Job
from perseusd.jobs.observed import OrderLearner
from perseusd.jobs.shape import JobShape
from perseusd.jobs.slot import StageSlot
from perseusd.planner.policy import Policy


def job_of_slots(
    shape: JobShape,
    gpu_name: str,
    policy: Policy,
    clocks_mhz: tuple[int, ...],
    waiting_by_stage: Sequence[dict[int, float]] = (),
) -> Job:
    """Job "train" of `shape` with a slot per stage, each supporting `clocks_mhz`; given `waiting_by_stage`,
    a slot per entry instead, stage s's waiting power by clock `waiting_by_stage[s]`."""
    job = Job("train", 1000, shape, gpu_name, "sig", policy)
    for stage in range(len(waiting_by_stage) or shape.num_stages):
        job.slots[f"GPU-{stage}"] = StageSlot(
            gpu=f"GPU-{stage}",
            pipeline=0,
            stage=stage,
            pid=1,
            num_stages=shape.num_stages,
            learner=OrderLearner(shape.num_microbatches, shape.chunks),
            supported_clocks_mhz=clocks_mhz,
            waiting_w_by_clock=waiting_by_stage[stage] if waiting_by_stage else {},
        )
    return job

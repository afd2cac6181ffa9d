"""What the coordination of spanning jobs (`perseusd.jobs.spanning`, its leader `perseusd.jobs.span_leader`)
needs of the job manager: solving, installing a solution, running and switching the plan, failing a job, and
what this node measured. The job manager is the one implementation."""

from __future__ import annotations

from typing import Protocol

from perseusd.jobs.job import Job
from perseusd.jobs.metering import MeasuredSaving
from perseusd.jobs.shape import StageOrder
from perseusd.planner.plan import Frontier
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints


class SpanHost(Protocol):
    """What the coordinator needs of the job manager."""

    def adopt_solution(self, job: Job, frontier: Frontier, profile: Profile, p_block_w: float) -> None: ...
    def run_plan(self, job: Job) -> None: ...
    def submit_solve(
        self,
        job: Job,
        profile: Profile,
        p_block_w: float,
        orders: tuple[StageOrder, ...],
        latency_s: float | None = None,
        waiting_w: WaitingPoints | None = None,
    ) -> float: ...
    def clock_latency_s(self, job: Job) -> float | None: ...
    def fail(self, job: Job, message: str) -> None: ...
    def measured(self, job: Job) -> MeasuredSaving | None: ...
    def switch_pipeline(self, job: Job, pipeline: int, index: int, from_step: int) -> None: ...

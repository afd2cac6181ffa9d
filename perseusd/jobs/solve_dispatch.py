"""A job's solve in the worker process (`jobs.solve_worker`, running `jobs.solving`), from its submission to
the frontier it returns: the solver's time unit and switch model, the per-user limit on solves, a large cached
frontier read in the worker instead, the solve's timeout and cancellation, and the frontier, deployed
(`jobs.deployment`) or, for a job whose pipelines span nodes, handed to their coordinator (`jobs.spanning`).

The job manager (`perseusd.jobs.manager`) submits a job's solve when its state machine reaches `solving`, and
collects it from the main loop's `tick`: nothing here waits for the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from perseusd.jobs.cache import FrontierFileError, JobCache
from perseusd.jobs.job import Job
from perseusd.jobs.settings import JobSettings
from perseusd.jobs.shape import StageOrder
from perseusd.jobs.solve_worker import SolveWorker
from perseusd.jobs.solving import PlanningTimes, Solved, SolveInput, auto_unit_time_s
from perseusd.jobs.spanning import SpanCoordinator
from perseusd.jobs.states import FAILED, RUNNING
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints, profile_to_csv
from perseusd.planner.switching import SwitchModel

logger = logging.getLogger(__name__)


class SolveDispatch:
    """The solves of the node's jobs in the worker (see module)."""

    def __init__(
        self,
        worker: SolveWorker,
        cache: JobCache | None,
        settings: JobSettings,
        jobs: Mapping[str, Job],
        spanning: SpanCoordinator | None,
        switch_model: Callable[[Job, float | None], SwitchModel | None],
        run: Callable[[Job], None],
    ) -> None:
        """`jobs`: the manager's, by name (a user's solves are counted over them); `switch_model`: how a job's
        GPUs switch clocks, given the latency its other nodes measured (the manager's); `run`: deploys a
        solved job's plan (`Deployment.run`)."""
        self._worker = worker
        self._cache = cache
        self.settings = settings
        self._jobs = jobs
        self.spanning = spanning
        self._switch_model = switch_model
        self._run = run

    # ------------------------------------------------------------------ submitting

    def submit_solve(
        self,
        job: Job,
        profile: Profile,
        p_block_w: float,
        orders: tuple[StageOrder, ...],
        latency_s: float | None = None,
        waiting_w: WaitingPoints | None = None,
    ) -> float:
        """Solve the job's frontier in the worker (`latency_s`: the highest clock-set latency its other nodes
        measured, `SpanHost.clock_latency_s`; `waiting_w`: the waiting power by held clock to judge waits
        at, None: the job's own for its own profile); the solver's time unit (s)."""
        unit_time_s = self.settings.unit_time_s or auto_unit_time_s(profile)
        switch = self._switch_model(job, latency_s)
        logger.info(
            "job %s: solving for %s",
            job.name,
            "instant clock changes"
            if switch is None
            else f"a {switch.latency_s * 1000:.4f} ms clock-set latency",  # to 0.1 us: replayable
        )
        task = SolveInput(
            job.name,
            job.shape,
            orders,
            profile_to_csv(profile),
            profile.source,
            p_block_w,
            unit_time_s,
            switch,
            waiting_w if waiting_w is not None else job.waiting_w if profile is job.profile else (),
            self._frontier_cache(job, profile),
        )
        job.orders = orders
        job.solve_future = self._worker.submit(task)
        job.solve_since_s = time.monotonic()
        return unit_time_s

    def submit(self, job: Job) -> None:
        """Solve the job's own profile (or read its cached frontier) where its user's other solves and its
        learned stage orders allow (else `tick` retries)."""
        if self._solving(job.uid) >= self.settings.max_solves_per_user:
            return  # the user's other solves first (tick retries)
        if job.cached_frontier_file is not None and job.profile is not None:
            if not self._worker.starting:  # else tick retries: the main loop never waits for the start
                self._submit_read(job, job.profile, job.cached_frontier_file)
            return
        orders = job.stage_orders()
        if orders is None or job.profile is None:
            return  # "observed": wait until every stage's order is learned (tick retries)
        job.planning_since_s, job.planning = job.state_since_s, None  # solving since profiling was done
        unit_time_s = self.submit_solve(job, job.profile, job.p_block_w, orders)
        logger.info("job %s: solving the frontier (unit %.3g s)", job.name, unit_time_s)

    def _submit_read(self, job: Job, profile: Profile, path: Path) -> None:
        """The worker reads the job's large cached frontier (`SolveInput.cached_frontier`) where the main
        loop would stall on it; the job is `solving` meanwhile."""
        task = SolveInput(
            job.name,
            job.shape,
            (),
            profile_to_csv(profile),
            profile.source,
            job.p_block_w,
            auto_unit_time_s(profile),
            cached_frontier=str(path),
        )
        job.solve_future = self._worker.submit(task)
        job.solve_since_s = time.monotonic()
        logger.info("job %s: reading its cached frontier in the solver worker", job.name)

    def _frontier_cache(self, job: Job, profile: Profile) -> str | None:
        """Where the worker writes the frontier of `job`'s solve of `profile` (its own profile's only: a
        spanning job's plan is in etcd), None where it is not cached."""
        if self._cache is None or job.span is not None or profile is not job.profile:
            return None
        return str(self._cache.frontier_path(job.signature))

    def _solving(self, uid: int) -> int:
        """Solves of `uid`'s jobs in the worker's queue or running."""
        return sum(1 for job in self._jobs.values() if job.uid == uid and job.solve_future is not None)

    # ------------------------------------------------------------------ ending

    def fail(self, job: Job, message: str) -> None:
        if job.state != FAILED:
            logger.warning("job %s: %s", job.name, message)
            self.cancel(job)
            job.enter(FAILED, message)

    def cancel(self, job: Job) -> None:
        """A job that ends or fails while solving: its solve is abandoned (its worker's memory and core go
        back at once; other jobs' solves go on)."""
        if job.solve_future is not None and not job.solve_future.done():
            self._worker.cancel(job.solve_future)
            logger.info("job %s: its solve was cancelled", job.name)
        job.solve_future = None

    # ------------------------------------------------------------------ collecting

    def collect(self, job: Job) -> None:
        """A `solving` job's solve, once done: run its frontier (or hand it to the job's coordinator); fail
        the job when it took longer than `solve_timeout_s` or the solver failed."""
        future = job.solve_future
        if future is not None and job.solve_since_s is not None and not future.done():
            if time.monotonic() - job.solve_since_s > self.settings.solve_timeout_s:
                limit_s = self.settings.solve_timeout_s
                self.fail(
                    job, f"solving took longer than {limit_s:g} s (solve_timeout_s): plan a smaller shape"
                )
            return
        if future is None or not future.done():
            return
        job.solve_future = None
        try:
            solved = future.result()
        except FrontierFileError as exc:  # a cached frontier the worker could not use: solve instead
            logger.warning("job %s: ignoring its cached frontier (solving again): %s", job.name, exc)
            job.cached_frontier_file = None
            self.submit(job)
            return
        except Exception as exc:  # the solver's error ends this job, never the daemon
            logger.error("job %s: solving failed: %s", job.name, exc)
            if job.span is not None and self.spanning is not None:
                self.spanning.leader.solve_failed(job, f"solving failed: {exc}")
            job.enter(FAILED, f"solving failed: {exc}")
            return
        if job.span is not None and self.spanning is not None:
            self.spanning.leader.solved(job, solved.frontier)
            return
        if solved.read_s is not None:
            self._read_done(job, solved)
            return
        job.set_frontier(solved.frontier)
        self._run(job)
        if job.state == RUNNING and job.planning_since_s is not None:
            job.planning = PlanningTimes(time.monotonic() - job.planning_since_s, solved.phases)
            logger.info(
                "job %s: plan deployed %.3f s after profiling (%s; %d points)",
                job.name,
                job.planning.total_s,
                job.planning.describe(),
                len(solved.frontier.points),
            )

    def _read_done(self, job: Job, solved: Solved) -> None:
        """The worker read the job's cached frontier: run it (unless an imported profile replaced the one it
        was solved from meanwhile: then solve)."""
        if job.cached_frontier_file is None:
            self.submit(job)
            return
        job.cached_frontier_file = None
        job.set_frontier(solved.frontier)
        self._run(job)
        logger.info(
            "job %s: running its cached frontier (%d points, read in %.2f s)",
            job.name,
            len(solved.frontier.points),
            solved.read_s,
        )

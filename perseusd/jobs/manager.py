"""The job manager: the node's jobs, the per-job state machine and solving; it admits registrations
(`jobs.registration`), and drives a job's profiling run (`jobs.profiling_run`) and the deployment of its plan
(`jobs.deployment`).

No transport: the daemon core calls `register`/`set_policy`/queries for requests, `on_event` for every event
of a leased GPU (after the lease check), `gpu_released` when a lease ends and `tick` from the main loop.
Events only record and, at iteration boundaries during profiling, submit the next clock (never waiting);
solving runs in a worker process; deployment installs per-GPU plans in the `PlanBook`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from perseus_client.protocol import (
    ComputationBegin,
    ComputationEnd,
    Message,
    Register,
    RegisterOk,
    StepBegin,
    StepEnd,
)

from perseusd.errors import JobNotFoundError, JobOwnerError
from perseusd.gpu.backend import GpuInfo
from perseusd.jobs.accuracy import AccuracyCheck
from perseusd.jobs.cache import FrontierFileError, JobCache
from perseusd.jobs.carbon_steering import CarbonSettings, CarbonSteering
from perseusd.jobs.cluster_link import ClusterLink
from perseusd.jobs.deployment import RUNNING_SAMPLE_PERIOD_S, Deployment
from perseusd.jobs.job import Job
from perseusd.jobs.lock_latency import job_latency_s
from perseusd.jobs.metering import MeasuredSaving
from perseusd.jobs.profiling_run import ProfilingRun
from perseusd.jobs.registration import PendingImport, check_joins, check_size, ended_why, new_job, new_slot
from perseusd.jobs.response import StragglerResponse
from perseusd.jobs.settings import JobGpus, JobSettings
from perseusd.jobs.shape import JobShape, StageOrder
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.solving import PlanningTimes, Solved, SolveInput, SolveWorker, auto_unit_time_s
from perseusd.jobs.spanning import SpanCoordinator
from perseusd.jobs.states import ENDED, FAILED, PROFILING, REGISTERED, RUNNING, SOLVING
from perseusd.jobs.tensor_groups import follow
from perseusd.jobs.waiting import set_waiting, waiting_alone
from perseusd.planner.plan import Frontier
from perseusd.planner.policy import Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints, profile_to_csv
from perseusd.planner.switching import SwitchModel
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)

MAX_ENDED_JOBS = 32
MIN_RUN_LEADS = 2.0
"""Lowered runs shorter than this many clock leads are merged into a higher neighbour before deployment."""
MIN_SWITCH_LATENCY_S = 0.001
"""Below this measured clock-set latency (simulated boards without a lock latency: ~0.1 ms, the call's own
overhead) the frontier is not followed: a change acts within the daemon's own event path, and the switch
model, which lays computations back to back, would count the first computation of every lowered run as
begun late (an A100 8 x 12 plan 19 of 96, where the GPUs measured 3-5 %) and keep it from being deployed."""


class JobManager:
    """Every job of this node, by name."""

    def __init__(
        self,
        gpus: JobGpus,
        plans: PlanBook,
        sampler: EnergySampler,
        worker: SolveWorker,
        cache: JobCache | None,
        settings: JobSettings,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        cluster: ClusterLink | None = None,
        carbon: CarbonSteering | None = None,
    ) -> None:
        self._gpus = gpus
        self._plans = plans
        self._sampler = sampler
        self._worker = worker
        self._cache = cache
        self.settings = settings
        self._clock_ns = clock_ns
        self.jobs: dict[str, Job] = {}
        self._by_gpu: dict[str, Job] = {}
        self.pending_imports: dict[tuple[int, str], PendingImport] = {}  # by (uid, job name)
        self.response = StragglerResponse(settings.stragglers, self._deploy_point, cluster)
        self.carbon = carbon or CarbonSteering(None, CarbonSettings())
        self.spanning = SpanCoordinator(cluster, settings.stragglers, self) if cluster is not None else None
        """Jobs whose pipelines span nodes (only with a cluster plane)."""
        self.profiling = ProfilingRun(gpus, plans, sampler, settings, clock_ns, self._by_gpu.get)
        """The profiling of jobs that have no profile (`jobs.profiling_run`)."""
        self.deployment = Deployment(
            gpus, plans, sampler, clock_ns, self.carbon, self.response, self._switch_model, self.spanning
        )
        self.deployment.ramp_bound_w_per_s = settings.ramp_bound_w_per_s
        """The plans of running jobs (`jobs.deployment`)."""

    # ------------------------------------------------------------------ registration

    def register(self, uid: int, pid: int, message: Register) -> RegisterOk:
        """Join (or create) a job with a GPU the caller leases (the core checked the lease)."""
        shape = JobShape.of(message)
        check_size(shape, self.settings.max_job_computations)
        info = self._gpus.info(message.gpu)
        job = self.jobs.get(message.job)
        if job is not None and not job.active:
            self._drop_job(job)
            job = None
        if job is None:
            job, imported = new_job(
                message, uid, shape, info.name, self.settings.policy, self.pending_imports, self._cache
            )
            self.jobs[job.name] = job
            if imported:
                self._store_profile(job)
            if job.cached_frontier_file is not None:
                self._worker.warm()  # to read it once the job is complete, never waiting for the start
            try:
                return self._join(job, uid, shape, message, pid, info)
            except BaseException:  # never leave a half-created job behind
                self._drop_job(job)
                raise
        return self._join(job, uid, shape, message, pid, info)

    def _join(
        self, job: Job, uid: int, shape: JobShape, message: Register, pid: int, info: GpuInfo
    ) -> RegisterOk:
        check_joins(job, uid, shape, message)
        current = self._by_gpu.get(message.gpu)
        if current is not None and current is not job:
            self._remove_slot(current, message.gpu)
        slot = job.slots.get(message.gpu)
        if slot is None:
            slot = new_slot(message, pid, shape, info)
            job.slots[message.gpu] = slot
            self._by_gpu[message.gpu] = job
            self._slot_joined(job, slot, info)
        self._advance(job)
        return RegisterOk(job=job.name, state=job.state, cached=job.cached)

    def _slot_joined(self, job: Job, slot: StageSlot, info: GpuInfo) -> None:
        if job.state == RUNNING:
            index = self.response.slot_joined(job, slot)
            if index is not None:
                self.deployment.deploy_point(job, slot, index)
        elif job.state in (REGISTERED, PROFILING) and job.profile is None:
            if not info.energy_counter_supported:
                job.error = (
                    f"GPU {slot.gpu} has no energy counter: import a profile (perseusctl profile import)"
                )
                return
            lead = next((s for s in job.stage_group(slot.pipeline, slot.stage) if s.sweep is not None), None)
            if lead is None:
                self.profiling.start(job, slot)
            else:  # a tensor-parallel GPU of a stage that profiles: it follows the stage's clocks
                follow(lead, slot, self._clock_ns())
                self._sampler.watch(slot.gpu, RUNNING_SAMPLE_PERIOD_S)  # its mean power is all it gives
                self.profiling.request_clock(slot, lead.requested_mhz)

    # ------------------------------------------------------------------ leaving

    def gpu_released(self, gpu: str) -> None:
        """A lease ended (release, client death, admin reset): the GPU leaves its job."""
        job = self._by_gpu.get(gpu)
        if job is not None:
            self._remove_slot(job, gpu)

    def _remove_slot(self, job: Job, gpu: str) -> None:
        slot = job.slots.pop(gpu, None)
        self._by_gpu.pop(gpu, None)
        self._sampler.unwatch(gpu)
        if slot is not None and slot.sweep is not None:
            self.profiling.promote_follower(job, slot)
        if slot is not None and all(s.pipeline != slot.pipeline for s in job.slots.values()):
            job.runs.pop(slot.pipeline, None)
            if self.response.cluster is not None:
                self.response.cluster.withdraw(job.cluster_key, slot.pipeline)
        if not job.slots and job.active:
            self.response.forget(job)
            if self.spanning is not None:
                self.spanning.ended(job)
            why = ended_why(job, slot)
            self._cancel_solve(job)
            job.enter(ENDED, why)
            logger.info("job %s ended%s", job.name, f": {why}" if why else "")
            self._trim_ended()

    def _trim_ended(self) -> None:
        ended = [j for j in self.jobs.values() if not j.active]
        for job in sorted(ended, key=lambda j: j.state_since_s)[: max(0, len(ended) - MAX_ENDED_JOBS)]:
            self._drop_job(job)

    def _drop_job(self, job: Job) -> None:
        for gpu in list(job.slots):
            self._by_gpu.pop(gpu, None)
            self._sampler.unwatch(gpu)
        self.jobs.pop(job.name, None)
        self.carbon.forget(job.name)

    def close(self) -> None:
        self._worker.close()

    # ------------------------------------------------------------------ events (hot path)

    def on_event(self, message: Message) -> None:
        """Record one event of a leased GPU; at an iteration boundary, submit the next profiling clock."""
        gpu: str = message.gpu  # type: ignore[attr-defined]
        job = self._by_gpu.get(gpu)
        if job is None:
            return
        slot = job.slots[gpu]
        if isinstance(message, ComputationBegin):
            slot.learner.computation_begin(message.instruction, message.microbatch, message.chunk)
            if slot.sweep is not None and slot.in_step and slot.iteration_clock_mhz is not None:
                slot.open_since_ns[(message.instruction, message.microbatch, message.chunk)] = (
                    message.timestamp_ns
                )
                self.profiling.read_capping(slot)
        elif isinstance(message, ComputationEnd):
            self.profiling.computation_end(slot, message)
            if job.state == RUNNING:
                self.response.computation_end(job, slot, message.timestamp_ns)
        elif isinstance(message, StepBegin):
            slot.step_begin(message.timestamp_ns)
            slot.current_step = message.step
            slot.learner.step_begin()
            if job.state == RUNNING:
                self.response.step_begin(job, slot, message.step, message.timestamp_ns)
        elif isinstance(message, StepEnd):
            slot.in_step = False
            slot.steps_done += 1
            slot.learner.step_end()
            if job.state == RUNNING:
                slot.running_steps += 1
                self.response.step_end(job, slot, message.step)
            if self.profiling.iteration_done(job, slot):
                self._advance(job)

    # ------------------------------------------------------------------ profiling

    def _finish_profiling(self, job: Job) -> bool:
        """End the job's profiling; False (the job failed, saying why) when it cannot support a plan."""
        problems = self.profiling.finish(job)
        if problems:
            self._cannot_plan(job, problems)
            return False
        self._store_profile(job)
        return True

    def _deploy_point(self, job: Job, slot: StageSlot, index: int) -> None:
        """The straggler response's deployment of a point on one GPU."""
        self.deployment.deploy_point(job, slot, index)

    def profiling_energy_j(self, job: Job) -> float | None:
        """What the job's GPUs used since its profiling began (`ProfilingRun.energy_j`)."""
        return self.profiling.energy_j(job)

    def measured(self, job: Job) -> MeasuredSaving | None:
        """The job's energy per iteration as the counters measured it (`Deployment.measured`)."""
        return self.deployment.measured(job)

    def _cannot_plan(self, job: Job, problems: list[str]) -> None:
        """The measurements cannot support a plan: never deploy one; say why (jobs table and log)."""
        message = "no plan: the measurements cannot support one: " + "; ".join(problems)
        logger.warning("job %s: %s (%d profiling iterations)", job.name, message, job.profiling_iterations)
        job.enter(FAILED, message)
        if self.spanning is not None:
            self.spanning.failed(job, message)

    def _frontier_cache(self, job: Job, profile: Profile) -> str | None:
        """Where the worker writes the frontier of `job`'s solve of `profile` (its own profile's only: a
        spanning job's plan is in etcd), None where it is not cached."""
        if self._cache is None or job.span is not None or profile is not job.profile:
            return None
        return str(self._cache.frontier_path(job.signature))

    def _store_profile(self, job: Job) -> None:
        if self._cache is None or job.profile is None or job.span is not None:
            return  # a spanning job's profile here is its stages' only: the etcd plan is its record
        about = {"job": job.name, "uid": job.uid, "shape": job.shape.describe(), "gpu": job.gpu_name}
        try:
            self._cache.store_profile(job.signature, job.profile, job.p_block_w, about, job.waiting_w)
        except OSError as exc:
            logger.warning("job %s: cannot cache the profile: %s", job.name, exc)

    # ------------------------------------------------------------------ state machine

    def _advance(self, job: Job) -> None:
        """Move `job` forward as far as its facts allow (never waits)."""
        if job.span is None and job.state == REGISTERED and not job.complete_pipelines():
            if self.spanning is None:
                set_waiting(job, waiting_alone(job))
            if self.spanning is None or not self.spanning.join(job):
                return
        if job.span is not None:
            self._advance_span(job)
            return
        if self.spanning is not None and job.state == REGISTERED:
            self.spanning.withdraw(job)
        if job.state == REGISTERED and job.complete_pipelines():
            set_waiting(job, "")
            if job.frontier is not None:
                self.deployment.run(job)
                return
            job.enter(PROFILING if job.profile is None else SOLVING, job.error)
            self._worker.warm()  # the solve will find the worker process started
        if job.state == PROFILING and self.profiling.finished(job):
            if not self._finish_profiling(job):
                return
            job.enter(SOLVING)
        if job.state == PROFILING and job.profile is not None:
            job.enter(SOLVING)  # a profile was imported while profiling
        if job.state == SOLVING and job.solve_future is None:
            self._submit_solve(job)

    def _advance_span(self, job: Job) -> None:
        """A job whose pipelines span nodes: profile this node's stages, share them, run the leader's plan."""
        assert self.spanning is not None
        assert job.span is not None
        if job.state == REGISTERED:
            plan = job.span.plan
            if plan is None or plan.solution is None:  # else: the job runs already, this node rejoins it
                job.enter(PROFILING if job.profile is None else SOLVING, job.error)
                if job.profile is not None:  # imported: share it as this node's measurement
                    self.spanning.share(job, job.profile, job.p_block_w, None)
        if job.state == PROFILING and job.span.plan is not None and job.span.plan.solution is not None:
            self.profiling.stop(job)  # the job was solved without this node (it joined late)
            job.enter(SOLVING)
        if job.state == PROFILING and self.profiling.finished(job):
            if not self._finish_profiling(job) or job.profile is None:
                return
            self.spanning.share(job, job.profile, job.p_block_w, job.iteration_overhead_s())
            job.enter(SOLVING)
        self.spanning.step(job)

    # ------------------------------------------------------------------ spanning jobs (SpanHost)

    def adopt_solution(self, job: Job, frontier: Frontier, profile: Profile, p_block_w: float) -> None:
        """Install a spanning job's solution (the leader's frontier and the merged profile)."""
        if job.profiling_slots():
            self.profiling.stop(job)
        job.profile, job.p_block_w, job.orders = profile, p_block_w, frontier.order
        job.all_max = None
        job.set_frontier(frontier)

    def run_plan(self, job: Job) -> None:
        if job.state == PROFILING:
            job.enter(SOLVING)
        self.deployment.run(job)

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
        measured, `clock_latency_s`; `waiting_w`: the waiting power by held clock to judge waits at, None:
        the job's own for its own profile); the solver's time unit (s)."""
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

    def fail(self, job: Job, message: str) -> None:
        if job.state != FAILED:
            logger.warning("job %s: %s", job.name, message)
            self._cancel_solve(job)
            job.enter(FAILED, message)

    def _cancel_solve(self, job: Job) -> None:
        """A job that ends or fails while solving: its solve is abandoned (its worker's memory and core go
        back at once; other jobs' solves go on)."""
        if job.solve_future is not None and not job.solve_future.done():
            self._worker.cancel(job.solve_future)
            logger.info("job %s: its solve was cancelled", job.name)
        job.solve_future = None

    def switch_pipeline(self, job: Job, pipeline: int, index: int, from_step: int) -> None:
        run = job.runs.get(pipeline)
        if run is not None:
            self.response.schedule_at(job, run, index, from_step)

    def _submit_solve(self, job: Job) -> None:
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

    def _read_done(self, job: Job, solved: Solved) -> None:
        """The worker read the job's cached frontier: run it (unless an imported profile replaced the one it
        was solved from meanwhile: then solve)."""
        if job.cached_frontier_file is None:
            self._submit_solve(job)
            return
        job.cached_frontier_file = None
        job.set_frontier(solved.frontier)
        self.deployment.run(job)
        logger.info(
            "job %s: running its cached frontier (%d points, read in %.2f s)",
            job.name,
            len(solved.frontier.points),
            solved.read_s,
        )

    def clock_latency_s(self, job: Job) -> float | None:
        """The clock-set latency of the job's GPUs here (`job_latency_s`; None: none measured)."""
        return job_latency_s([self._gpus.clock_set_latencies_s(slot.gpu) for slot in job.slots.values()])

    def _switch_model(self, job: Job, others_s: float | None = None) -> SwitchModel | None:
        """How the job's GPUs switch clocks: the slowest measured clock-set latency, here or (`others_s`) on
        the job's other nodes (None: none measured, or under `MIN_SWITCH_LATENCY_S`: plans run as solved)."""
        latencies_s = [s for s in (self.clock_latency_s(job), others_s) if s is not None]
        if not latencies_s:
            return None
        latency_s = max(latencies_s)
        if latency_s < MIN_SWITCH_LATENCY_S:
            return None
        lead_s = latency_s + self.settings.clock_lead_s if self.settings.clock_lead_s > 0 else 0.0
        return SwitchModel(latency_s, lead_s, min_run_s=MIN_RUN_LEADS * lead_s)

    def tick(self) -> None:
        """From the main loop: collect finished solves, retry waiting jobs."""
        for job in list(self.jobs.values()):
            if job.state == SOLVING:
                self._collect_solve(job)
            if job.span is not None and job.state != ENDED and self.spanning is not None:
                if self.spanning.sync(job):
                    self._advance_span(job)
            elif job.state in (REGISTERED, PROFILING, SOLVING):
                self._advance(job)
            elif job.state == RUNNING:
                self.response.tick(job)
                self.deployment.follow_grid(job)
                self.deployment.check_accuracy(job)

    def _solving(self, uid: int) -> int:
        """Solves of `uid`'s jobs in the worker's queue or running."""
        return sum(1 for job in self.jobs.values() if job.uid == uid and job.solve_future is not None)

    def _collect_solve(self, job: Job) -> None:
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
            self._submit_solve(job)
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
        self.deployment.run(job)
        if job.state == RUNNING and job.planning_since_s is not None:
            job.planning = PlanningTimes(time.monotonic() - job.planning_since_s, solved.phases)
            logger.info(
                "job %s: plan deployed %.3f s after profiling (%s; %d points)",
                job.name,
                job.planning.total_s,
                job.planning.describe(),
                len(solved.frontier.points),
            )

    # ------------------------------------------------------------------ deployment

    def job_for(self, uid: int, name: str, *, admin: bool) -> Job:
        """The job `name` for a request of user `uid`: `JobNotFoundError` when there is none, `JobOwnerError`
        when another user registered it (unless the requester is an admin)."""
        job = self.jobs.get(name)
        if job is None:
            raise JobNotFoundError(name)
        check_owner(job, uid, admin=admin)
        return job

    def set_policy(self, job: Job, policy: Policy) -> None:
        job.policy = policy
        if self.spanning is not None and job.span is not None:
            self.spanning.policy_set(job, time.time())  # its leader follows the newest policy
            return
        if job.state == RUNNING:
            self.deployment.run(job)

    def reprofile_with(
        self, job: Job, profile: Profile, p_block_w: float, waiting_w: WaitingPoints = ()
    ) -> None:
        """An imported profile (with the waiting power by clock its file gave, if any) replaces the job's:
        solve again (the running plan stays until then)."""
        job.profile, job.p_block_w, job.cached = profile, p_block_w, False
        job.waiting_w, job.cached_frontier_file = waiting_w, None
        job.all_max = None  # counted again on the new profile
        job.energy_rel_err, job.accuracy = {}, AccuracyCheck()
        job.frontier, job.points, job.points_by_index = None, [], {}
        self._store_profile(job)
        for slot in job.profiling_slots():
            self._sampler.unwatch(slot.gpu)
            slot.sweep = None
        if job.state in (PROFILING, RUNNING, FAILED):
            job.enter(SOLVING)
        self._advance(job)


def check_owner(job: Job, uid: int, *, admin: bool) -> None:
    """Only the user who registered a job (or an admin) reads or changes it; others get `JobOwnerError`."""
    if job.uid != uid and not admin:
        raise JobOwnerError(job.name)

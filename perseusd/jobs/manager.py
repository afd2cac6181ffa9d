"""The job manager: the node's jobs and the per-job state machine; it admits registrations
(`jobs.registration`), and drives a job's profiling run (`jobs.profiling_run`), its solve
(`jobs.solve_dispatch`) and the deployment of its plan (`jobs.deployment`).

No transport: the daemon core calls `register`/`set_policy`/queries for requests, `on_event` for every event
of a leased GPU (after the lease check), `gpu_released` when a lease ends and `tick` from the main loop.
Events only record (`jobs.event_recording`) and, at iteration boundaries during profiling, submit the next
clock (never waiting); solving runs in a worker process; deployment installs per-GPU plans in the `PlanBook`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from perseus_client.protocol import Message, Register, RegisterOk

from perseusd.errors import JobNotFoundError, JobOwnerError
from perseusd.gpu.backend import GpuInfo
from perseusd.jobs.accuracy import AccuracyCheck
from perseusd.jobs.cache import JobCache
from perseusd.jobs.carbon_steering import CarbonSettings, CarbonSteering
from perseusd.jobs.cluster_link import ClusterLink
from perseusd.jobs.deployment import RUNNING_SAMPLE_PERIOD_S, Deployment
from perseusd.jobs.event_recording import record_event
from perseusd.jobs.job import Job
from perseusd.jobs.lock_latency import job_latency_s, switch_model
from perseusd.jobs.metering import MeasuredSaving
from perseusd.jobs.profiling_run import ProfilingRun
from perseusd.jobs.registration import PendingImport, check_joins, check_size, ended_why, new_job, new_slot
from perseusd.jobs.response import StragglerResponse
from perseusd.jobs.settings import JobGpus, JobSettings
from perseusd.jobs.shape import JobShape
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.solve_dispatch import SolveDispatch
from perseusd.jobs.solve_worker import SolveWorker
from perseusd.jobs.spanning import SpanCoordinator
from perseusd.jobs.states import ENDED, FAILED, PROFILING, REGISTERED, RUNNING, SOLVING
from perseusd.jobs.tensor_groups import follow
from perseusd.jobs.waiting import set_waiting, waiting_alone
from perseusd.planner.plan import Frontier
from perseusd.planner.policy import Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints
from perseusd.planner.switching import SwitchModel
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)

MAX_ENDED_JOBS = 32


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
        self.solves = SolveDispatch(
            worker, cache, settings, self.jobs, self.spanning, self._switch_model, self.deployment.run
        )
        """The jobs' solves in the worker (`jobs.solve_dispatch`)."""
        self.submit_solve = self.solves.submit_solve
        """A spanning job's solve, for its coordinator (`SpanHost.submit_solve`)."""

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
            self.solves.cancel(job)
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
        if record_event(job, job.slots[gpu], message, self.profiling, self.response):
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
            self.solves.submit(job)

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

    def fail(self, job: Job, message: str) -> None:
        self.solves.fail(job, message)

    def switch_pipeline(self, job: Job, pipeline: int, index: int, from_step: int) -> None:
        run = job.runs.get(pipeline)
        if run is not None:
            self.response.schedule_at(job, run, index, from_step)

    def clock_latency_s(self, job: Job) -> float | None:
        """The clock-set latency of the job's GPUs here (`job_latency_s`; None: none measured)."""
        return job_latency_s([self._gpus.clock_set_latencies_s(slot.gpu) for slot in job.slots.values()])

    def _switch_model(self, job: Job, others_s: float | None = None) -> SwitchModel | None:
        """How the job's GPUs switch clocks: the slowest measured clock-set latency, here or (`others_s`) on
        the job's other nodes (None: none measured, or under `MIN_SWITCH_LATENCY_S`: plans run as solved)."""
        return switch_model([self.clock_latency_s(job), others_s], self.settings.clock_lead_s)

    def tick(self) -> None:
        """From the main loop: collect finished solves, retry waiting jobs."""
        for job in list(self.jobs.values()):
            if job.state == SOLVING:
                self.solves.collect(job)
            if job.span is not None and job.state != ENDED and self.spanning is not None:
                if self.spanning.sync(job):
                    self._advance_span(job)
            elif job.state in (REGISTERED, PROFILING, SOLVING):
                self._advance(job)
            elif job.state == RUNNING:
                self.response.tick(job)
                self.deployment.follow_grid(job)
                self.deployment.check_accuracy(job)

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

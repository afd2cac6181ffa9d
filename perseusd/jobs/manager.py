"""The job manager: registrations, the per-job state machine, online profiling, solving and deployment.

No transport: the daemon core calls `register`/`set_policy`/queries for requests, `on_event` for every event
of a leased GPU (after the lease check), `gpu_released` when a lease ends and `tick` from the main loop.
Events only record and, at iteration boundaries during profiling, submit the next clock (never waiting);
solving runs in a worker process; deployment installs per-GPU plans in the `PlanBook`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from perseus_client.protocol import (
    ComputationBegin,
    ComputationEnd,
    ErrorCode,
    Message,
    ProtocolError,
    Register,
    RegisterOk,
    StepBegin,
    StepEnd,
)

from perseusd.errors import JobNotFoundError, JobOwnerError, PerseusError
from perseusd.gpu.backend import GpuInfo
from perseusd.gpu.owner import GpuReading
from perseusd.jobs.accuracy import AccuracyCheck, profile_error_pct
from perseusd.jobs.cache import JobCache
from perseusd.jobs.capping import CAPPING_READS, capped_clock_mhz, finished_readings
from perseusd.jobs.carbon_steering import CarbonSettings, CarbonSteering
from perseusd.jobs.cluster_link import ClusterLink
from perseusd.jobs.job import Job
from perseusd.jobs.metering import SLOW_READS_MIN_SPAN_S, MeasuredSaving, iteration_energy_j, job_measurement
from perseusd.jobs.no_harm import apply_no_harm, energy_rel_errors
from perseusd.jobs.observed import OrderLearner
from perseusd.jobs.response import StragglerResponse
from perseusd.jobs.shape import JobShape, StageOrder, signature
from perseusd.jobs.slot import MAX_INTERVALS, StageSlot
from perseusd.jobs.solving import PlanningTimes, SolveInput, SolveWorker, auto_unit_time_s
from perseusd.jobs.spanning import SpanCoordinator
from perseusd.jobs.states import ENDED, FAILED, PROFILING, REGISTERED, RUNNING, SOLVING
from perseusd.jobs.straggling import StragglerSettings
from perseusd.jobs.tensor_groups import finish_following, follow, stage_scale
from perseusd.jobs.waiting import set_waiting, waiting_alone
from perseusd.planner.baselines import all_max
from perseusd.planner.dag import Instruction
from perseusd.planner.plan import Frontier
from perseusd.planner.policy import PointSummary, Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.switching import SwitchModel
from perseusd.profiling.adequacy import plan_problems
from perseusd.profiling.estimator import OptionEstimate, StageEstimate, estimate_segment
from perseusd.profiling.fill import fill_stage
from perseusd.profiling.sweep import StageSweep, SweepSettings
from perseusd.profiling.trace import Interval, OptionKey
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)
RUNNING_SAMPLE_PERIOD_S = 1.0
"""How often a running job's energy counters are read (a mean power over many seconds needs no more)."""

MAX_ENDED_JOBS = 32
MIN_RUN_LEADS = 2.0
ACCURACY_PERIOD_S = 1.0
"""How often a running job's measured saving is judged against its prediction (`jobs.accuracy`)."""
UNKNOWN_OPTION_ERROR = 0.01
"""The per-option energy error a re-plan scales when the profile carries none (imported or cached)."""
"""Lowered runs shorter than this many clock leads are merged into a higher neighbour before deployment."""


class JobGpus(Protocol):
    """What the manager needs of the GPU registry."""

    def info(self, uuid: str) -> GpuInfo: ...
    def submit_locked_sm_clock_mhz(self, uuid: str, clock_mhz: int) -> Future[int]: ...
    def clock_set_latency_ns(self, uuid: str) -> int | None: ...
    def submit_read(self, uuid: str) -> Future[GpuReading]: ...


@dataclass(frozen=True)
class PendingImport:
    """A profile imported for a job its user has not registered yet."""

    profile: Profile
    p_block_w: float


@dataclass(frozen=True)
class JobSettings:
    """Job behaviour from the daemon configuration."""

    warmup_iterations: int = 2
    max_profiling_iterations: int = 300
    unit_time_s: float = 0.0
    """The solver's time quantum; 0: automatic (shortest computation / 50, on a 1-2-5 step)."""
    policy: Policy = field(default_factory=Policy)
    clock_lead_s: float = 0.002
    """The margin added to the measured clock-set latency when raising early (0: raises wait for the end)."""
    fill_clocks: bool = True
    """Add options at the clocks the sweep did not visit from each key's trusted fit (`profiling.fill`)."""
    sweep: SweepSettings = field(default_factory=SweepSettings)
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    max_job_computations: int = 4096
    """The largest schedule a job may register (stages x microbatches x chunks x 2): its schedule is built
    on the main loop and its solve's time and memory grow with it."""
    max_solves_per_user: int = 1
    """Solves of one user's jobs in the worker's queue at a time (the others wait their turn in `solving`):
    one user's many jobs never make another user's wait behind all of them."""
    solve_timeout_s: float = 900.0
    """A solve that runs longer fails its job (and frees the worker for the others)."""


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

    # ------------------------------------------------------------------ registration

    def register(self, uid: int, pid: int, message: Register) -> RegisterOk:
        """Join (or create) a job with a GPU the caller leases (the core checked the lease)."""
        shape = JobShape.of(message)
        self._check_size(shape)
        info = self._gpus.info(message.gpu)
        job = self.jobs.get(message.job)
        if job is not None and not job.active:
            self._drop_job(job)
            job = None
        if job is None:
            job = self._new_job(message.job, uid, shape, info.name, message.run)
            try:
                return self._join(job, uid, shape, message, pid, info)
            except BaseException:  # never leave a half-created job behind
                self._drop_job(job)
                raise
        return self._join(job, uid, shape, message, pid, info)

    def _check_size(self, shape: JobShape) -> None:
        limit = self.settings.max_job_computations
        if shape.computations > limit:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"register: {shape.describe()} has {shape.computations} computations (stages x "
                f"microbatches x chunks x 2); this daemon plans at most {limit} (max_job_computations)",
            )

    def _join(
        self, job: Job, uid: int, shape: JobShape, message: Register, pid: int, info: GpuInfo
    ) -> RegisterOk:
        self._check_joins(job, uid, shape, message)
        current = self._by_gpu.get(message.gpu)
        if current is not None and current is not job:
            self._remove_slot(current, message.gpu)
        slot = job.slots.get(message.gpu)
        if slot is None:
            slot = StageSlot(
                gpu=message.gpu,
                pipeline=message.pipeline,
                stage=message.stage,
                pid=pid,
                num_stages=shape.num_stages,
                learner=OrderLearner(shape.num_microbatches, shape.chunks),
                supported_clocks_mhz=info.supported_sm_clocks_mhz,
            )
            job.slots[message.gpu] = slot
            self._by_gpu[message.gpu] = job
            self._slot_joined(job, slot, info)
        self._advance(job)
        return RegisterOk(job=job.name, state=job.state, cached=job.cached)

    def _new_job(self, name: str, uid: int, shape: JobShape, gpu_name: str, run: str = "") -> Job:
        job = Job(
            name, uid, shape, gpu_name, signature(name, uid, shape, gpu_name), self.settings.policy, run
        )
        self.jobs[name] = job
        imported = self.pending_imports.pop((uid, name), None)
        if imported is not None:
            job.profile, job.p_block_w = imported.profile, imported.p_block_w
            self._store_profile(job)
        elif self._cache is not None:
            entry = self._cache.load(job.signature, shape)
            if entry is not None:
                job.profile, job.p_block_w, job.cached = entry.profile, entry.p_block_w, True
                if entry.frontier is not None:
                    job.set_frontier(entry.frontier)
        logger.info(
            "job %s (uid %d, %s) registered%s", name, uid, shape.describe(), " from cache" * job.cached
        )
        return job

    def _check_joins(self, job: Job, uid: int, shape: JobShape, message: Register) -> None:
        if job.uid != uid:
            raise JobOwnerError(job.name)
        if job.shape != shape:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"job {job.name} is {job.shape.describe()}, not {shape.describe()}"
            )
        if job.run != message.run:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"job {job.name} is run {job.run!r}, not {message.run!r}: another run"
            )
        group = [s.gpu for s in job.stage_group(message.pipeline, message.stage) if s.gpu != message.gpu]
        if len(group) >= shape.stage_gpus:
            gpus = f"{shape.stage_gpus} GPU(s) per stage" if shape.stage_gpus > 1 else "one GPU per stage"
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"pipeline {message.pipeline} stage {message.stage} of job {job.name} runs on "
                f"{', '.join(group)} ({gpus}; give stage_gpus for tensor parallelism)",
            )

    def _slot_joined(self, job: Job, slot: StageSlot, info: GpuInfo) -> None:
        if job.state == RUNNING:
            index = self.response.slot_joined(job, slot)
            if index is not None:
                self._deploy_point(job, slot, index)
        elif job.state in (REGISTERED, PROFILING) and job.profile is None:
            if not info.energy_counter_supported:
                job.error = (
                    f"GPU {slot.gpu} has no energy counter: import a profile (perseusctl profile import)"
                )
                return
            lead = next((s for s in job.stage_group(slot.pipeline, slot.stage) if s.sweep is not None), None)
            if lead is None:
                self._start_profiling(slot)
            else:  # a tensor-parallel GPU of a stage that profiles: it follows the stage's clocks
                follow(lead, slot, self._clock_ns())
                self._sampler.watch(slot.gpu, RUNNING_SAMPLE_PERIOD_S)  # its mean power is all it gives
                self._request_clock(slot, lead.requested_mhz)

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
            self._promote_follower(job, slot)
        if slot is not None and all(s.pipeline != slot.pipeline for s in job.slots.values()):
            job.runs.pop(slot.pipeline, None)
            if self.response.cluster is not None:
                self.response.cluster.withdraw(job.cluster_key, slot.pipeline)
        if not job.slots and job.active:
            self.response.forget(job)
            if self.spanning is not None:
                self.spanning.ended(job)
            why = _ended_why(job, slot)
            self._cancel_solve(job)
            job.enter(ENDED, why)
            logger.info("job %s ended%s", job.name, f": {why}" if why else "")
            self._trim_ended()

    def _promote_follower(self, job: Job, lead: StageSlot) -> None:
        """A stage's profiling lead left: its first follower profiles the stage from now on."""
        followers = job.followers(lead)
        if not followers:
            return
        new_lead, rest = followers[0], followers[1:]
        new_lead.group_lead = None
        self._start_profiling(new_lead)
        for follower in rest:
            follow(new_lead, follower, follower.profiling_since_ns)

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
                self._read_capping(slot)
        elif isinstance(message, ComputationEnd):
            self._computation_end(slot, message)
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
            self._iteration_done(job, slot)

    def _computation_end(self, slot: StageSlot, message: ComputationEnd) -> None:
        started_ns = slot.open_since_ns.pop((message.instruction, message.microbatch, message.chunk), None)
        clock_mhz = slot.iteration_clock_mhz
        if started_ns is None or clock_mhz is None or message.timestamp_ns <= started_ns:
            return
        applied_ns = slot.clock_applied_ns
        if applied_ns is None or started_ns < applied_ns:
            # Began before the iteration's clock was applied: it ran at a mix of clocks. Not a measurement,
            # and the counter windows it overlaps are dropped.
            if len(slot.blind_spans) < MAX_INTERVALS:
                slot.blind_spans.append((started_ns, message.timestamp_ns))
            return
        if len(slot.intervals) < MAX_INTERVALS:
            key = slot.key(message.instruction, message.chunk)
            slot.intervals.append(Interval(key, clock_mhz, started_ns, message.timestamp_ns))
            slot.timed_computations += 1

    # ------------------------------------------------------------------ profiling

    def _start_profiling(self, slot: StageSlot) -> None:
        shape = self._job_of(slot).shape
        keys = [slot.key(i, chunk) for chunk in range(shape.chunks) for i in shape.instructions]
        slot.sweep = StageSweep(slot.supported_clocks_mhz, keys, self.settings.sweep)
        slot.profiling_since_ns = self._clock_ns()
        self._sampler.watch(slot.gpu)
        self._request_clock(slot, max(slot.supported_clocks_mhz))

    def _job_of(self, slot: StageSlot) -> Job:
        return self._by_gpu[slot.gpu]

    def _request_clock(self, slot: StageSlot, clock_mhz: int | None) -> None:
        if clock_mhz is None or (clock_mhz == slot.requested_mhz and slot.clock_future is not None):
            return
        slot.requested_mhz = clock_mhz
        slot.clock_applied_ns = None
        future = self._gpus.submit_locked_sm_clock_mhz(slot.gpu, clock_mhz)
        slot.clock_future = future

        def applied(done: Future[int]) -> None:
            # On the GPU's owner thread: when the lock call returned, the new clock was in force.
            if slot.clock_future is done and done.exception() is None:
                slot.clock_applied_ns = self._clock_ns()

        future.add_done_callback(applied)
        if slot.sweep is not None:  # the stage's other GPUs run its clock too
            job = self._by_gpu.get(slot.gpu)
            for follower in job.followers(slot) if job is not None else ():
                self._request_clock(follower, clock_mhz)

    def _read_capping(self, slot: StageSlot) -> None:
        """At the highest clock, read the GPU while it computes (a few reads per iteration): the clock it
        really runs and whether the power limit holds it down."""
        sweep = slot.sweep
        if sweep is None or sweep.clocks_done > 0 or len(slot.capping_reads) >= CAPPING_READS:
            return
        if slot.clock_applied_ns is None:
            return
        slot.capping_reads.append(self._gpus.submit_read(slot.gpu))

    def _iteration_done(self, job: Job, slot: StageSlot) -> None:
        if job.state not in (REGISTERED, PROFILING) or slot.sweep is None or slot.sweep.done:
            return
        if slot.steps_done <= self.settings.warmup_iterations:
            slot.intervals.clear()  # warm-up iterations are discarded
            slot.blind_spans.clear()
            slot.profiling_since_ns = slot.segment_since_ns = self._clock_ns()
            self._request_clock(slot, slot.sweep.current_clock_mhz)
            return
        slot.profiling_steps += 1
        self._measure_iteration(slot, slot.sweep)
        if slot.sweep.done or slot.profiling_steps >= self.settings.max_profiling_iterations:
            self._request_clock(slot, max(slot.supported_clocks_mhz))
        else:
            self._request_clock(slot, slot.sweep.current_clock_mhz)
        self._advance(job)

    def _measure_iteration(self, slot: StageSlot, sweep: StageSweep) -> None:
        """Estimate the current clock's segment (cheap: only its intervals and samples, the blocking power
        of the first segment reused) and let the sweep decide; a finished segment's options are kept."""
        clock_mhz = sweep.current_clock_mhz
        slot.segment_iterations += 1
        samples = self._sampler.samples(slot.gpu, slot.segment_since_ns)
        current = estimate_segment(
            slot.intervals, samples, blind=slot.blind_spans, fallback_p_block_w=slot.p_block_w
        )
        p_block_w = slot.p_block_w if slot.p_block_w is not None else current.p_block_w
        slot.estimate = StageEstimate(
            options={**slot.done_options, **current.options}, p_block_w=p_block_w, windows=current.windows
        )
        capped_mhz = (
            capped_clock_mhz(finished_readings(slot.capping_reads)) if sweep.clocks_done == 0 else None
        )
        sweep.iteration_done(slot.estimate, capped_clock_mhz=capped_mhz)
        if sweep.current_clock_mhz != clock_mhz:  # the segment is done: keep it, start the next one
            logger.info(
                "gpu %s: profiled %d MHz in %d iterations%s; clocks %s",
                slot.gpu,
                clock_mhz,
                slot.segment_iterations,
                f" (power-capped at {capped_mhz} MHz)" if capped_mhz is not None else "",
                ", ".join(str(c) for c in sweep.clocks_mhz),
            )
            if clock_mhz == max(slot.supported_clocks_mhz) and slot.all_max_energy_j is None:
                slot.all_max_energy_j = iteration_energy_j(samples, slot.mean_iteration_time_s())
                slot.all_max_iteration_s = slot.median_recent_iteration_s(slot.segment_iterations - 1)
            slot.segment_iterations = 0
            slot.done_options.update({k: v for k, v in current.options.items() if k[1] == clock_mhz})
            slot.p_block_w = p_block_w
            slot.intervals.clear()
            slot.blind_spans.clear()
            slot.segment_since_ns = self._clock_ns()

    def _profiling_finished(self, job: Job) -> bool:
        slots = list(job.profiling_slots())
        if not slots or not (job.complete_pipelines() or job.span is not None):
            return False
        limit = self.settings.max_profiling_iterations
        return all(
            (s.sweep is not None and s.sweep.done) or s.profiling_steps >= limit for s in slots
        ) and all(s.estimate is not None for s in slots)

    def _finish_profiling(self, job: Job) -> bool:
        kept = {
            s.gpu: with_highest_clocks(s.sweep.kept(s.estimate), s.estimate)
            for s in job.profiling_slots()
            if s.sweep is not None and s.estimate is not None
        }
        if self.settings.fill_clocks:
            kept = self._with_fitted_clocks(job, kept)
        counted = False
        timed = any(s.timed_computations for s in job.profiling_slots())
        scales = {
            s.gpu: stage_scale(s, job.followers(s), self._sampler.samples) for s in job.profiling_slots()
        }
        for slot in list(job.profiling_slots()):
            followers = job.followers(slot)
            finish_following(slot, followers, self._sampler.samples)
            job.profiling_iterations = max(job.profiling_iterations, slot.steps_done)
            for gpu_slot in (slot, *followers):
                samples = self._sampler.samples(gpu_slot.gpu, gpu_slot.profiling_since_ns)
                if len(samples) >= 2:
                    counted = True
                    job.profiling_energy_j += (samples[-1].energy_mj - samples[0].energy_mj) / 1000.0
                self._sampler.unwatch(gpu_slot.gpu)
            slot.intervals.clear()
        measured = job.measured_profile(kept, scales)
        counted_j = job.profiling_energy_j if counted else None
        if measured is None:
            self._cannot_plan(job, [nothing_measured(counted_j, timed)])
            return False
        problems = plan_problems(measured[0], counted_j)
        if problems:
            self._cannot_plan(job, problems)
            return False
        job.profile, job.p_block_w = measured
        job.energy_rel_err = energy_rel_errors(kept)
        job.accuracy = AccuracyCheck(profile_error_pct=profile_error_pct(job.energy_rel_err.values()))
        self._store_profile(job)
        logger.info(
            "job %s profiled in %d iterations: %d measurements, blocking power %.1f W",
            job.name,
            job.profiling_iterations,
            len(job.profile.measurements),
            job.p_block_w,
        )
        return True

    def _with_fitted_clocks(
        self, job: Job, kept: dict[str, list[OptionEstimate]]
    ) -> dict[str, list[OptionEstimate]]:
        """`kept` with each GPU's options at the clocks its sweep did not visit where its key's curves are
        trusted (`perseusd.profiling.fill`), Pareto-filtered again; the log says what was filled or why."""
        out = {}
        for slot in job.profiling_slots():
            if slot.gpu not in kept or slot.sweep is None or slot.estimate is None:
                continue
            filled, notes = fill_stage(
                slot.estimate, slot.sweep.clocks_mhz, slot.supported_clocks_mhz, kept[slot.gpu]
            )
            out[slot.gpu] = filled
            logger.info("job %s stage %d: %s", job.name, slot.stage, "; ".join(notes))
        return {gpu: out.get(gpu, options) for gpu, options in kept.items()}

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
            self._cache.store_profile(job.signature, job.profile, job.p_block_w, about)
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
                self._run(job)
                return
            job.enter(PROFILING if job.profile is None else SOLVING, job.error)
            self._worker.warm()  # the solve will find the worker process started
        if job.state == PROFILING and self._profiling_finished(job):
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
            self._stop_profiling(job)  # the job was solved without this node (it joined late)
            job.enter(SOLVING)
        if job.state == PROFILING and self._profiling_finished(job):
            if not self._finish_profiling(job) or job.profile is None:
                return
            self.spanning.share(job, job.profile, job.p_block_w, job.iteration_overhead_s())
            job.enter(SOLVING)
        self.spanning.step(job)

    def _stop_profiling(self, job: Job) -> None:
        for slot in list(job.profiling_slots()):
            for gpu_slot in (slot, *job.followers(slot)):
                self._sampler.unwatch(gpu_slot.gpu)
                gpu_slot.group_lead = None
            slot.sweep = None
            slot.intervals.clear()

    # ------------------------------------------------------------------ spanning jobs (SpanHost)

    def adopt_solution(self, job: Job, frontier: Frontier, profile: Profile, p_block_w: float) -> None:
        """Install a spanning job's solution (the leader's frontier and the merged profile)."""
        if job.profiling_slots():
            self._stop_profiling(job)
        job.profile, job.p_block_w, job.orders = profile, p_block_w, frontier.order
        job.all_max = None
        job.set_frontier(frontier)

    def run_plan(self, job: Job) -> None:
        if job.state == PROFILING:
            job.enter(SOLVING)
        self._run(job)

    def submit_solve(
        self,
        job: Job,
        profile: Profile,
        p_block_w: float,
        orders: tuple[StageOrder, ...],
        latency_s: float | None = None,
    ) -> None:
        unit_time_s = self.settings.unit_time_s or auto_unit_time_s(profile)
        task = SolveInput(
            job.name,
            job.shape,
            orders,
            profile_to_csv(profile),
            profile.source,
            p_block_w,
            unit_time_s,
            self._switch_model(job, latency_s),
        )
        job.orders = orders
        job.solve_future = self._worker.submit(task)
        job.solve_since_s = time.monotonic()

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
        orders = job.stage_orders()
        if orders is None or job.profile is None:
            return  # "observed": wait until every stage's order is learned (tick retries)
        unit_time_s = self.settings.unit_time_s or auto_unit_time_s(job.profile)
        task = SolveInput(
            job.name,
            job.shape,
            orders,
            profile_to_csv(job.profile),
            job.profile.source,
            job.p_block_w,
            unit_time_s,
            self._switch_model(job),
        )
        job.orders = orders
        job.planning_since_s, job.planning = job.state_since_s, None  # solving since profiling was done
        job.solve_future = self._worker.submit(task)
        job.solve_since_s = time.monotonic()
        logger.info("job %s: solving the frontier (unit %.3g s)", job.name, unit_time_s)

    def clock_latency_s(self, job: Job) -> float | None:
        """The slowest measured clock-set latency of the job's GPUs here (None: none measured)."""
        measured = [self._gpus.clock_set_latency_ns(slot.gpu) for slot in job.slots.values()]
        latencies_s = [ns / 1e9 for ns in measured if ns is not None]
        return max(latencies_s) if latencies_s else None

    def _switch_model(self, job: Job, others_s: float | None = None) -> SwitchModel | None:
        """How the job's GPUs switch clocks: the slowest measured clock-set latency, here or (`others_s`) on
        the job's other nodes (None: none measured)."""
        latencies_s = [s for s in (self.clock_latency_s(job), others_s) if s is not None]
        if not latencies_s:
            return None
        latency_s = max(latencies_s)
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
                self._follow_grid(job)
                self._check_accuracy(job)

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
        except Exception as exc:  # the solver's error ends this job, never the daemon
            logger.error("job %s: solving failed: %s", job.name, exc)
            if job.span is not None and self.spanning is not None:
                self.spanning.solve_failed(job, f"solving failed: {exc}")
            job.enter(FAILED, f"solving failed: {exc}")
            return
        if job.span is not None and self.spanning is not None:
            self.spanning.solved(job, solved.frontier)
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
        if self._cache is not None:  # after deploying: writing a large frontier takes a while
            try:
                self._cache.store_frontier(job.signature, solved.frontier)
            except OSError as exc:
                logger.warning("job %s: cannot cache the frontier: %s", job.name, exc)

    # ------------------------------------------------------------------ deployment

    def _run(self, job: Job) -> None:
        if job.all_max is None:
            job.all_max = self._all_max(job)
            overhead_s = job.iteration_overhead_s()
            if overhead_s:
                logger.info(
                    "job %s: iterations at all-max clocks measured %.1f ms longer than planned (time outside "
                    "its computations); time targets allow for it",
                    job.name,
                    overhead_s * 1000,
                )
        spanning = self.spanning if job.span is not None else None
        deployed = job.choose_point() if spanning is None else spanning.deployed(job)
        if deployed is None:
            job.enter(FAILED, "the frontier is empty")
            return
        if spanning is None:  # a spanning job's point is its leader's choice
            deployed = self.carbon.steer(job, deployed, self._reference_power_w(job))
        job.deployed = deployed
        switching = self._switch_model(job)  # each node judges its own stages (do no harm)
        apply_no_harm(job, 0.0 if switching is None else switching.latency_s)
        deployed = job.deployed
        for slot in job.slots.values():
            if not slot.run_since_ns:  # measure the running plan's energy from the counters, once a second
                self._sampler.watch(slot.gpu, RUNNING_SAMPLE_PERIOD_S)
                slot.run_since_ns = self._clock_ns()
            slot.sweep = None
            slot.intervals.clear()
        self.response.start(job)
        for slot in job.slots.values():
            self._deploy_point(job, slot, deployed.point.index)
            if not job.active:
                return
        if job.state != RUNNING:
            job.enter(RUNNING)
        if spanning is not None:
            spanning.apply(job)
        self.response.decide(job)
        logger.info(
            "job %s runs frontier point %d: %.4f s/iteration (fastest %.4f s), %.1f J",
            job.name,
            deployed.point.index,
            deployed.point.time_s,
            deployed.fastest.time_s,
            deployed.point.energy_j,
        )

    def _reference_power_w(self, job: Job) -> float:
        """Chase's reference power for one pipeline: its stages times their GPUs' maximum power limit."""
        limits_w = [self._gpus.info(gpu).power_limit_max_w for gpu in job.slots]
        return job.shape.num_stages * max(limits_w, default=0.0)

    def _follow_grid(self, job: Job) -> None:
        """A running job and the grid: count its carbon; a carbon job's point for the new interval."""
        default = job.choose_point() if self.carbon.due(job) else None  # the policy's default point
        if default is not None and job.deployed is not None:
            steered = self.carbon.steer(job, default, self._reference_power_w(job))
            if steered.point != job.deployed.point:
                job.deployed = steered
                self.response.decide(job)  # every pipeline switches at its next iteration boundary
        self.carbon.count(job, self._sampler.samples, self._clock_ns())

    def _check_accuracy(self, job: Job) -> None:
        """Once a second: the plan's measured saving against its prediction; re-plan once when it falls
        short by more than the profile's error (`jobs.accuracy`). Not for a job whose pipelines span nodes:
        this node's GPUs measure only their stages, and its plan is the spanning solve's (`jobs.spanning`)."""
        now_s = time.monotonic()
        if now_s - job.accuracy_checked_s < ACCURACY_PERIOD_S or job.deployed is None or job.all_max is None:
            return
        if job.span is not None:
            return
        job.accuracy_checked_s = now_s
        measured = self.measured(job)
        if measured is None or not measured.all_max_j or job.all_max.energy_j <= 0:
            return
        predicted_pct = 100.0 * (1.0 - job.deployed.point.energy_j / job.all_max.energy_j)
        measured_pct = 100.0 * (1.0 - measured.running_j / measured.all_max_j)
        error_pct = job.accuracy.profile_error_pct
        was = job.accuracy.action
        scale = job.accuracy.judge(predicted_pct, measured_pct, error_pct, measured.iterations)
        check = job.accuracy
        if scale is None:
            if check.action == "kept" and was != "kept":
                logger.warning(
                    "job %s: measured saving %.1f %% still falls short of the re-planned %.1f %% by %.1f "
                    "points (error %.1f): keeps the plan; re-profile it (import a profile) to do better",
                    job.name, measured_pct, predicted_pct, check.gap_pts or 0.0, check.error_pts or 0.0,
                )  # fmt: skip
            return
        logger.warning(
            "job %s: measured saving %.1f %% falls short of the predicted %.1f %% by %.1f points, more than "
            "its error (%.1f points, profile error %s): re-planned with the profile's errors x %.1f",
            job.name, measured_pct, predicted_pct, check.gap_pts or 0.0, check.error_pts or 0.0,
            "unknown" if error_pct is None else f"{error_pct:.2f} %", scale,
        )  # fmt: skip
        base = job.energy_rel_err or dict.fromkeys(_profile_options(job), UNKNOWN_OPTION_ERROR)
        job.energy_rel_err = {key: err * scale for key, err in base.items()}
        for slot in job.slots.values():
            slot.run_since_ns = 0  # measure the re-planned run afresh
            slot.running_steps = 0
        self._run(job)

    def _all_max(self, job: Job) -> PointSummary | None:
        """All-max clocks on the job's profile: what the energy saved is counted against."""
        orders = job.orders or job.stage_orders()
        if job.profile is None or orders is None:
            return None
        try:
            point = all_max(job.shape.dag(orders), job.profile, job.p_block_w)
        except PerseusError as exc:
            logger.warning("job %s: no all-max reference (%s)", job.name, exc)
            return None
        return PointSummary(-1, point.time_s, point.energy_j)

    def _deploy_point(self, job: Job, slot: StageSlot, index: int) -> None:
        """Install frontier point `index`'s plan on one GPU of the job."""
        entries = job.plan_entries(slot.stage, index)
        slack = job.plan_slack_s(index)
        try:
            self._plans.set(
                slot.gpu,
                entries,
                slot.supported_clocks_mhz,
                job.plan_times_s(slot.stage, entries),
                slack_s=None if slack is None else slack[slot.stage],
            )
        except ProtocolError as exc:
            job.enter(FAILED, f"deploying the plan on {slot.gpu} failed: {exc.message}")
            return
        if slot.plan_index is None:
            slot.running_steps = 0
        slot.plan_index = index

    def profiling_energy_j(self, job: Job) -> float | None:
        """What the job's GPUs used since its profiling began, by their counters (None: not profiling, or
        no two readings yet)."""
        if job.state != PROFILING:
            return None
        total_j, counted = 0.0, False
        for slot in job.profiling_slots():
            for gpu_slot in (slot, *job.followers(slot)):
                samples = self._sampler.samples(gpu_slot.gpu, gpu_slot.profiling_since_ns)
                if len(samples) >= 2:
                    total_j += (samples[-1].energy_mj - samples[0].energy_mj) / 1000.0
                    counted = True
        return total_j if counted else None

    def measured(self, job: Job) -> MeasuredSaving | None:
        """The job's energy per iteration as the counters measured it (None until every GPU's is)."""
        per_gpu = [
            (
                iteration_energy_j(
                    self._sampler.samples(slot.gpu, slot.run_since_ns),
                    slot.mean_iteration_time_s(),
                    SLOW_READS_MIN_SPAN_S,
                )
                if slot.run_since_ns
                else None,
                slot.all_max_energy_j,
            )
            for slot in job.slots.values()
        ]
        steps = sum(slot.running_steps for slot in job.slots.values())
        return job_measurement(per_gpu, steps / len(job.slots) if job.slots else 0.0)

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
            self._run(job)

    def reprofile_with(self, job: Job, profile: Profile, p_block_w: float) -> None:
        """An imported profile replaces the job's: solve again (the running plan stays until then)."""
        job.profile, job.p_block_w, job.cached = profile, p_block_w, False
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


def _profile_options(job: Job) -> list[tuple[int, Instruction, int]]:
    if job.profile is None:
        return []
    return [(m.stage, m.instruction, m.freq_mhz) for m in job.profile.measurements]


def nothing_measured(counted_j: float | None, timed: bool) -> str:
    """Why profiling kept no measurement: no counted energy, no energy per computation, or no events."""
    if counted_j == 0:
        return "profiling measured nothing: the energy counters did not move (0 J): nothing drives these GPUs"
    if timed:
        return (
            "profiling measured nothing: no computation's energy stands out from the counters "
            "(does a workload drive these GPUs?)"
        )
    return "profiling measured nothing: no computation was timed (are computation events sent?)"


def _ended_why(job: Job, last: StageSlot | None) -> str:
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


def with_highest_clocks(kept: list[OptionEstimate], estimate: StageEstimate) -> list[OptionEstimate]:
    """`kept` plus each key's highest measured clock: the fastest plan must be able to run all-max, even
    when measurement noise makes the highest clock look dominated by the next one."""
    highest: dict[OptionKey, OptionEstimate] = {}
    for est in estimate.options.values():
        if est.key not in highest or est.clock_mhz > highest[est.key].clock_mhz:
            highest[est.key] = est
    present = {(e.key, e.clock_mhz) for e in kept}
    return kept + [e for e in highest.values() if (e.key, e.clock_mhz) not in present]


def check_owner(job: Job, uid: int, *, admin: bool) -> None:
    """Only the user who registered a job (or an admin) reads or changes it; others get `JobOwnerError`."""
    if job.uid != uid and not admin:
        raise JobOwnerError(job.name)

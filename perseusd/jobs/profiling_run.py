"""A job's online profiling: each stage's clock sweep on its GPUs, the measurements, the profile they make.

The job manager (`perseusd.jobs.manager`) starts a stage's sweep when its GPU joins a job that has no profile
and hands this every computation's end and every iteration's end of a profiling GPU. At an iteration boundary
the sweep measures the iteration at its clock and submits the next clock (never waiting); a tensor-parallel
stage's other GPUs follow its lead's clocks (`jobs.tensor_groups`). When every stage has swept its clocks,
`finish` makes the job's profile, or says why the measurements cannot support a plan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from perseus_client.protocol import ComputationEnd

from perseusd.jobs.accuracy import AccuracyCheck, profile_error_pct
from perseusd.jobs.capping import CAPPING_READS, capped_clock_mhz, finished_readings
from perseusd.jobs.job import Job
from perseusd.jobs.metering import iteration_energy_j
from perseusd.jobs.no_harm import energy_rel_errors
from perseusd.jobs.settings import JobGpus, JobSettings
from perseusd.jobs.slot import MAX_INTERVALS, StageSlot
from perseusd.jobs.states import PROFILING, REGISTERED
from perseusd.jobs.tensor_groups import finish_following, follow, stage_scale
from perseusd.profiling.adequacy import plan_problems
from perseusd.profiling.estimator import OptionEstimate, StageEstimate, estimate_segment, segment_stand_in_w
from perseusd.profiling.fill import fill_stage
from perseusd.profiling.sweep import StageSweep
from perseusd.profiling.trace import Interval, OptionKey
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class ProfilingRun:
    """The profiling of every job of the node that has no profile (see module)."""

    gpus: JobGpus
    clocks: PlanBook
    """The one writer of the GPUs' clocks (`PlanBook.submit_clock`)."""
    sampler: EnergySampler
    settings: JobSettings
    clock_ns: Callable[[], int]
    job_of: Callable[[str], Job | None]
    """The job a GPU is in (None: in none)."""

    def start(self, job: Job, slot: StageSlot) -> None:
        """Begin the stage's clock sweep on `slot`'s GPU (at its highest clock)."""
        shape = job.shape
        keys = [slot.key(i, chunk) for chunk in range(shape.chunks) for i in shape.instructions]
        slot.sweep = StageSweep(slot.supported_clocks_mhz, keys, self.settings.sweep)
        slot.profiling_since_ns = self.clock_ns()
        self.sampler.watch(slot.gpu)
        self.request_clock(slot, max(slot.supported_clocks_mhz))

    def request_clock(self, slot: StageSlot, clock_mhz: int | None) -> None:
        """Lock `slot`'s GPU (and the stage's other GPUs) at `clock_mhz` without waiting (None: nothing)."""
        if clock_mhz is None or (clock_mhz == slot.requested_mhz and slot.clock_future is not None):
            return
        slot.requested_mhz = clock_mhz
        slot.clock_applied_ns = None
        future = self.clocks.submit_clock(slot.gpu, clock_mhz)
        slot.clock_future = future

        def applied(done: Future[int]) -> None:
            # On the GPU's owner thread: when the lock call returned, the new clock was in force.
            if slot.clock_future is done and done.exception() is None:
                slot.clock_applied_ns = self.clock_ns()

        future.add_done_callback(applied)
        if slot.sweep is not None:  # the stage's other GPUs run its clock too
            job = self.job_of(slot.gpu)
            for follower in job.followers(slot) if job is not None else ():
                self.request_clock(follower, clock_mhz)

    def read_capping(self, slot: StageSlot) -> None:
        """At the highest clock, read the GPU while it computes (a few reads per iteration): the clock it
        really runs and whether the power limit holds it down."""
        sweep = slot.sweep
        if sweep is None or sweep.clocks_done > 0 or len(slot.capping_reads) >= CAPPING_READS:
            return
        if slot.clock_applied_ns is None:
            return
        slot.capping_reads.append(self.gpus.submit_read(slot.gpu))

    def computation_end(self, slot: StageSlot, message: ComputationEnd) -> None:
        """Record a computation timed at one clock (a measurement of the sweep)."""
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

    def iteration_done(self, job: Job, slot: StageSlot) -> bool:
        """An iteration of `slot`'s GPU ended: measure it, move the sweep on; True: the job may move on."""
        if job.state not in (REGISTERED, PROFILING) or slot.sweep is None or slot.sweep.done:
            return False
        if slot.steps_done <= self.settings.warmup_iterations:
            slot.intervals.clear()  # warm-up iterations are discarded
            slot.blind_spans.clear()
            slot.profiling_since_ns = slot.segment_since_ns = self.clock_ns()
            self.request_clock(slot, slot.sweep.current_clock_mhz)
            return False
        slot.profiling_steps += 1
        self._measure_iteration(slot, slot.sweep)
        if slot.sweep.done or slot.profiling_steps >= self.settings.max_profiling_iterations:
            self.request_clock(slot, max(slot.supported_clocks_mhz))
        else:
            self.request_clock(slot, slot.sweep.current_clock_mhz)
        return True

    def _measure_iteration(self, slot: StageSlot, sweep: StageSweep) -> None:
        """Estimate the current clock's segment (cheap: only its intervals and samples; the first segment's
        blocking power as the reference, the least measured above to stand in) and let the sweep decide; a
        finished segment's options are kept."""
        clock_mhz = sweep.current_clock_mhz
        slot.segment_iterations += 1
        samples = self.sampler.samples(slot.gpu, slot.segment_since_ns)
        current = estimate_segment(
            slot.intervals,
            samples,
            blind=slot.blind_spans,
            fallback_p_block_w=slot.p_block_w,
            stand_in_w=segment_stand_in_w(slot.p_block_w, slot.waiting_w_by_clock.values()),
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
                "gpu %s: profiled %d MHz in %d iterations%s%s; clocks %s",
                slot.gpu,
                clock_mhz,
                slot.segment_iterations,
                _waits_note(current),
                f" (power-capped at {capped_mhz} MHz)" if capped_mhz is not None else "",
                ", ".join(str(c) for c in sweep.clocks_mhz),
            )
            if clock_mhz == max(slot.supported_clocks_mhz) and slot.all_max_energy_j is None:
                slot.all_max_energy_j = iteration_energy_j(samples, slot.mean_iteration_time_s())
                slot.all_max_iteration_s = slot.median_recent_iteration_s(slot.segment_iterations - 1)
            slot.segment_iterations = 0
            slot.done_options.update({k: v for k, v in current.options.items() if k[1] == clock_mhz})
            slot.p_block_w = p_block_w
            if clock_mhz is not None and (waiting_w := current.measured_p_block_w) is not None:
                slot.waiting_w_by_clock[clock_mhz] = waiting_w
            slot.intervals.clear()
            slot.blind_spans.clear()
            slot.segment_since_ns = self.clock_ns()

    def finished(self, job: Job) -> bool:
        """Every profiling GPU of the job swept its clocks (or reached the iteration limit)."""
        slots = list(job.profiling_slots())
        if not slots or not (job.complete_pipelines() or job.span is not None):
            return False
        limit = self.settings.max_profiling_iterations
        return all(
            (s.sweep is not None and s.sweep.done) or s.profiling_steps >= limit for s in slots
        ) and all(s.estimate is not None for s in slots)

    def finish(self, job: Job) -> list[str]:
        """End the job's profiling: its measured profile, or why the measurements cannot support a plan."""
        waiting_w = least_waiting_w(job)
        kept = {
            s.gpu: with_highest_clocks(s.sweep.kept(s.estimate, waiting_w, top_aside=True), s.estimate)
            for s in job.profiling_slots()
            if s.sweep is not None and s.estimate is not None
        }
        if self.settings.fill_clocks:
            kept = self._with_fitted_clocks(job, kept, waiting_w)
        counted = False
        timed = any(s.timed_computations for s in job.profiling_slots())
        scales = {
            s.gpu: stage_scale(s, job.followers(s), self.sampler.samples) for s in job.profiling_slots()
        }
        for slot in list(job.profiling_slots()):
            followers = job.followers(slot)
            finish_following(slot, followers, self.sampler.samples)
            job.profiling_iterations = max(job.profiling_iterations, slot.steps_done)
            for gpu_slot in (slot, *followers):
                energy_j = self._energy_j(gpu_slot)
                if energy_j is not None:
                    counted = True
                    job.profiling_energy_j += energy_j
                self.sampler.unwatch(gpu_slot.gpu)
            slot.intervals.clear()
        measured = job.measured_profile(kept, scales)
        counted_j = job.profiling_energy_j if counted else None
        if measured is None:
            return [nothing_measured(counted_j, timed)]
        problems = plan_problems(measured[0], counted_j)
        if problems:
            return problems
        job.profile, job.p_block_w = measured
        job.waiting_w = job.measured_waiting_w(scales)
        job.energy_rel_err = energy_rel_errors(kept)
        job.accuracy = AccuracyCheck(profile_error_pct=profile_error_pct(job.energy_rel_err.values()))
        logger.info(
            "job %s profiled in %d iterations: %d measurements, blocking power %.1f W (waiting: %s)",
            job.name,
            job.profiling_iterations,
            len(job.profile.measurements),
            job.p_block_w,
            ", ".join(f"{watts:.1f} W at {clock} MHz" for clock, watts in job.waiting_w) or "none measured",
        )
        return []

    def _with_fitted_clocks(
        self, job: Job, kept: dict[str, list[OptionEstimate]], waiting_w: float
    ) -> dict[str, list[OptionEstimate]]:
        """`kept` with each GPU's options at the clocks its sweep did not visit where its key's curves are
        trusted (`perseusd.profiling.fill`), Pareto-filtered again; the log says what was filled or why."""
        out = {}
        for slot in job.profiling_slots():
            if slot.gpu not in kept or slot.sweep is None or slot.estimate is None:
                continue
            filled, notes = fill_stage(
                slot.estimate,
                slot.sweep.clocks_mhz,
                slot.supported_clocks_mhz,
                kept[slot.gpu],
                waiting_w,
                top_aside=True,
            )
            out[slot.gpu] = filled
            logger.info("job %s stage %d: %s", job.name, slot.stage, "; ".join(notes))
        return {gpu: out.get(gpu, options) for gpu, options in kept.items()}

    def stop(self, job: Job) -> None:
        """Abandon the job's profiling (its plan came from elsewhere)."""
        for slot in list(job.profiling_slots()):
            for gpu_slot in (slot, *job.followers(slot)):
                self.sampler.unwatch(gpu_slot.gpu)
                gpu_slot.group_lead = None
            slot.sweep = None
            slot.intervals.clear()

    def energy_j(self, job: Job) -> float | None:
        """What the job's GPUs used since its profiling began, by their counters (None: not profiling, or
        no two readings yet)."""
        if job.state != PROFILING:
            return None
        total_j, counted = 0.0, False
        for slot in job.profiling_slots():
            for gpu_slot in (slot, *job.followers(slot)):
                energy_j = self._energy_j(gpu_slot)
                if energy_j is not None:
                    total_j += energy_j
                    counted = True
        return total_j if counted else None

    def _energy_j(self, slot: StageSlot) -> float | None:
        """What `slot`'s GPU used since its profiling began, by its counter (None: no two readings yet)."""
        samples = self.sampler.samples(slot.gpu, slot.profiling_since_ns)
        if len(samples) < 2:
            return None
        return (samples[-1].energy_mj - samples[0].energy_mj) / 1000.0

    def promote_follower(self, job: Job, lead: StageSlot) -> None:
        """A stage's profiling lead left: its first follower profiles the stage from now on."""
        followers = job.followers(lead)
        if not followers:
            return
        new_lead, rest = followers[0], followers[1:]
        new_lead.group_lead = None
        self.start(job, new_lead)
        for follower in rest:
            follow(new_lead, follower, follower.profiling_since_ns)


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


def least_waiting_w(job: Job) -> float:
    """The least power the job's GPUs drew waiting, at any held clock they measured (0 W: none measured):
    what a computation that runs longer into its wait saves per second at the least, so the options kept
    include the clocks below the least energy that still save (`pareto_options`)."""
    return min((watts for _, watts in job.measured_waiting_w()), default=0.0)


def with_highest_clocks(kept: list[OptionEstimate], estimate: StageEstimate) -> list[OptionEstimate]:
    """`kept` plus each key's highest measured clock: the fastest plan must be able to run all-max, even
    when measurement noise makes the highest clock look dominated by the next one."""
    highest: dict[OptionKey, OptionEstimate] = {}
    for est in estimate.options.values():
        if est.key not in highest or est.clock_mhz > highest[est.key].clock_mhz:
            highest[est.key] = est
    present = {(e.key, e.clock_mhz) for e in kept}
    return kept + [e for e in highest.values() if (e.key, e.clock_mhz) not in present]


def _waits_note(estimate: StageEstimate) -> str:
    """The segment's waiting power for its log line: measured, or the stand-in its fit used."""
    if estimate.p_block_w is None:
        return ""
    source = "measured" if estimate.p_block_regressed else "not measured, fitted at"
    return f", waits {source} {estimate.p_block_w:.1f} W"

"""Running a job's plan: the frontier point its policy chooses (then the grid's carbon and do-no-harm), that
point's plan on every GPU of the job, the energy the counters measure, and the measured saving judged against
the prediction (a re-plan when it falls short by more than the profile's error, `jobs.accuracy`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from perseusd.errors import InvalidValueError, PerseusError
from perseusd.jobs.carbon_steering import CarbonSteering
from perseusd.jobs.job import Job
from perseusd.jobs.metering import SLOW_READS_MIN_SPAN_S, MeasuredSaving, iteration_energy_j, job_measurement
from perseusd.jobs.no_harm import apply_no_harm
from perseusd.jobs.ramp_bounding import apply_ramp_bound, bounded_rows, gpu_limit_w_per_s
from perseusd.jobs.response import StragglerResponse
from perseusd.jobs.settings import JobGpus
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.spanning import SpanCoordinator
from perseusd.jobs.states import FAILED, RUNNING
from perseusd.planner.baselines import all_max
from perseusd.planner.dag import Instruction
from perseusd.planner.policy import PointSummary
from perseusd.planner.switching import SwitchModel
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)

RUNNING_SAMPLE_PERIOD_S = 1.0
"""How often a running job's energy counters are read (a mean power over many seconds needs no more)."""
ACCURACY_PERIOD_S = 1.0
"""How often a running job's measured saving is judged against its prediction (`jobs.accuracy`)."""
UNKNOWN_OPTION_ERROR = 0.01
"""The per-option energy error a re-plan scales when the profile carries none (imported or cached)."""


class Deployment:
    """Deploys and follows the plans of the node's running jobs (see module)."""

    def __init__(
        self,
        gpus: JobGpus,
        plans: PlanBook,
        sampler: EnergySampler,
        clock_ns: Callable[[], int],
        carbon: CarbonSteering,
        response: StragglerResponse,
        switch_model: Callable[[Job], SwitchModel | None],
        spanning: SpanCoordinator | None,
    ) -> None:
        """`switch_model`: how a job's GPUs switch clocks (the manager's, from their measured latency)."""
        self._gpus = gpus
        self._plans = plans
        self._sampler = sampler
        self._clock_ns = clock_ns
        self.carbon = carbon
        self.response = response
        self._switch_model = switch_model
        self.spanning = spanning
        self.ramp_bound_w_per_s = 0.0
        """The node's power ramp bound (W/s; 0: none), a slice for each GPU (`jobs.ramp_bounding`)."""

    def run(self, job: Job) -> None:
        """Deploy the job's chosen frontier point on every GPU of the job (and enter RUNNING)."""
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
        apply_ramp_bound(job, self.ramp_bound_w_per_s, len(self._gpus.uuids))
        deployed = job.deployed
        for slot in job.slots.values():
            if not slot.run_since_ns:  # measure the running plan's energy from the counters, once a second
                self._sampler.watch(slot.gpu, RUNNING_SAMPLE_PERIOD_S)
                slot.run_since_ns = self._clock_ns()
            slot.sweep = None
            slot.intervals.clear()
        self.response.start(job)
        for slot in job.slots.values():
            self.deploy_point(job, slot, deployed.point.index)
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

    def deploy_point(self, job: Job, slot: StageSlot, index: int) -> None:
        """Install frontier point `index`'s plan on one GPU of the job."""
        if self.ramp_bound_w_per_s > 0:
            bounded_rows(job, index, gpu_limit_w_per_s(self.ramp_bound_w_per_s, len(self._gpus.uuids)))
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
        except InvalidValueError as exc:
            job.enter(FAILED, f"deploying the plan on {slot.gpu} failed: {exc.located()}")
            return
        if slot.plan_index is None:
            slot.running_steps = 0
        slot.plan_index = index

    def follow_grid(self, job: Job) -> None:
        """A running job and the grid: count its carbon; a carbon job's point for the new interval."""
        default = job.choose_point() if self.carbon.due(job) else None  # the policy's default point
        if default is not None and job.deployed is not None:
            steered = self.carbon.steer(job, default, self._reference_power_w(job))
            if steered.point != job.deployed.point:
                job.deployed = steered
                self.response.decide(job)  # every pipeline switches at its next iteration boundary
        self.carbon.count(job, self._sampler.samples, self._clock_ns())

    def check_accuracy(self, job: Job) -> None:
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
        self.run(job)

    def measured(self, job: Job) -> MeasuredSaving | None:
        """The job's energy per iteration as the counters measured it (None until every GPU's is)."""
        per_gpu = [
            (
                iteration_energy_j(
                    self._sampler.samples(slot.gpu, slot.run_since_ns),
                    slot.mean_iteration_time_s(slot.run_since_ns),
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

    def _reference_power_w(self, job: Job) -> float:
        """Chase's reference power for one pipeline: its stages times their GPUs' maximum power limit."""
        limits_w = [self._gpus.info(gpu).power_limit_max_w for gpu in job.slots]
        return job.shape.num_stages * max(limits_w, default=0.0)


def _profile_options(job: Job) -> list[tuple[int, Instruction, int]]:
    if job.profile is None:
        return []
    return [(m.stage, m.instruction, m.freq_mhz) for m in job.profile.measurements]

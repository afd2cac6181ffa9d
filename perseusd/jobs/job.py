"""A job: its registered GPUs, its state and what each state produced (profile, frontier, plan).

The states and the moves between them are `perseusd.jobs.states`. A job waits in `registered` until one
pipeline has all its stages; it is `running` directly when the cache had its frontier (a large one: once
the solver worker has read it).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus_client.codes import JobState
from perseus_client.protocol import PlanEntry

from perseusd.cluster.span_board import JobIdentity
from perseusd.errors import PerseusError
from perseusd.jobs.accuracy import AccuracyCheck
from perseusd.jobs.cluster_link import RemoteView
from perseusd.jobs.shape import JobShape, StageOrder
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.solving import PlanningTimes, Solved
from perseusd.jobs.span_state import SpanState
from perseusd.jobs.states import ACTIVE, FAILED, REGISTERED, check_move
from perseusd.jobs.straggling import ActiveStraggler, PipelineRun
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.descent_limits import deployable
from perseusd.planner.plan import Frontier, frontier_to_document, plan_document, plan_from_frontier
from perseusd.planner.policy import PointSummary, Policy
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.slack import stage_slack_s
from perseusd.planner.waiting import pooled_by_clock
from perseusd.profiling.estimator import OptionEstimate


@dataclass(frozen=True)
class Deployed:
    """The frontier point a job runs and when it was deployed."""

    point: PointSummary
    fastest: PointSummary
    slowest: PointSummary


class Job:
    """One job on this node: its pipelines and stages here (for a job whose pipelines span nodes, `span`
    holds what it shares with the others through etcd)."""

    def __init__(
        self,
        name: str,
        uid: int,
        shape: JobShape,
        gpu_name: str,
        signature: str,
        policy: Policy,
        run: str = "",
    ):
        self.name = name
        self.uid = uid
        self.shape = shape
        self.run = run
        self.identity = JobIdentity(
            name,
            uid,
            shape.schedule,
            shape.num_stages,
            shape.num_microbatches,
            shape.chunks,
            shape.stage_gpus,
            run,
        )
        self.cluster_key = self.identity.key()
        """The job's key in etcd: its identity's digest, so same-name jobs of other owners, shapes or runs
        never share facts."""
        self.span: SpanState | None = None
        """Set once the job runs as one job over several nodes (its pipelines span them)."""
        self.gpu_name = gpu_name
        self.signature = signature
        self.policy = policy
        self.state: JobState = REGISTERED
        self.state_since_s = time.monotonic()
        self.error = ""
        self.slots: dict[str, StageSlot] = {}
        self.cached = False
        self.profile: Profile | None = None
        self.p_block_w = 0.0
        self.waiting_w: tuple[tuple[int, float], ...] = ()
        """Waiting power by held clock, (MHz, W) ascending, measured while profiling (`measured_waiting_w`);
        empty: `p_block_w` at every clock (an imported or cached profile)."""
        self.orders: tuple[StageOrder, ...] | None = None
        self.frontier: Frontier | None = None
        self.cached_frontier_file: Path | None = None
        """A cached frontier too large to read on the main loop, for the solver worker to read when the job
        is complete (`JobCache`); None once read, or when there is none."""
        self.points: list[PointSummary] = []
        self.points_by_index: dict[int, PointSummary] = {}
        self.deployed: Deployed | None = None
        self.solve_future: Future[Solved] | None = None
        self.solve_since_s: float | None = None
        """When the solve of `solve_future` was submitted (monotonic s)."""
        self.planning_since_s: float | None = None
        """When profiling was done (`time.monotonic`): the solve being waited for began then."""
        self.planning: PlanningTimes | None = None
        """From profiling done to the plan deployed, by phase (None: not solved here, or not deployed yet)."""
        self.profiling_iterations = 0
        self.profiling_energy_j = 0.0
        # Stragglers, once running: each local pipeline's run, the stragglers known and the one planned for.
        self.runs: dict[int, PipelineRun] = {}
        self.announced: dict[int, ActiveStraggler] = {}
        self.detected: dict[int, ActiveStraggler] = {}
        self.remote_stragglers: dict[int, ActiveStraggler] = {}
        self.straggler: ActiveStraggler | None = None
        self.detect_from_step = 0  # detectors hold until this step after a re-plan
        self.replans = 0
        self.remote: RemoteView | None = None
        self.all_max: PointSummary | None = None
        self.energy_rel_err: dict[tuple[int, Instruction, int], float] = {}
        """Per profiled option, its energy's relative standard error (online profiling only)."""
        self.safe_clocks: dict[int, int] = {}
        """Stages that run one clock instead of their plan at point `safe_for_index` (do no harm)."""
        self.safe_for_index: int | None = None
        self.ramp_clocks: dict[int, tuple[tuple[int, ...], ...]] = {}
        """Per frontier point, its clocks per stage under the node's ramp bound (`jobs.ramp_bounding`)."""
        self.ramp_note = ""
        """What the ramp bound did to the deployed point ("": no bound, or not deployed yet)."""
        self.plan_note = ""
        self.departure = ""
        """Why the running plan departs from its prediction ("": it does not, or not yet known)."""
        """Why the deployed plan differs from the frontier point (`jobs.no_harm`); "" when it does not."""
        self.accuracy = AccuracyCheck()
        """The plan's predicted saving against its measured one (`jobs.accuracy`)."""
        self.accuracy_checked_s = 0.0
        self.energy_saved_j = 0.0
        # Power cap: the slowest-needed point the node cap allows (None: uncapped) and the job's tier.
        self.cap_index: int | None = None

    # ------------------------------------------------------------------ state

    def enter(self, state: JobState, error: str = "") -> None:
        """Move to `state` (`IllegalMoveError` for a move the state machine does not have)."""
        check_move(self.name, self.state, state)
        self.state = state
        self.state_since_s = time.monotonic()
        if error or state != FAILED:
            self.error = error

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def slot_at(self, pipeline: int, stage: int) -> StageSlot | None:
        for slot in self.slots.values():
            if (slot.pipeline, slot.stage) == (pipeline, stage):
                return slot
        return None

    def pipelines(self) -> dict[int, list[StageSlot]]:
        by_pipeline: dict[int, list[StageSlot]] = {}
        for slot in self.slots.values():
            by_pipeline.setdefault(slot.pipeline, []).append(slot)
        return dict(sorted(by_pipeline.items()))

    def complete_pipelines(self) -> list[int]:
        """Pipelines with every stage registered (each with its `stage_gpus` GPUs)."""
        needed = self.shape.num_stages * self.shape.stage_gpus
        return [p for p, slots in self.pipelines().items() if len(slots) == needed]

    def stage_group(self, pipeline: int, stage: int) -> list[StageSlot]:
        """The GPUs running one stage of one pipeline together (tensor parallel), in registration order: the
        first leads its profiling."""
        return [s for s in self.slots.values() if (s.pipeline, s.stage) == (pipeline, stage)]

    def followers(self, lead: StageSlot) -> list[StageSlot]:
        """The GPUs that follow `lead`'s clocks while it profiles their stage."""
        return [s for s in self.slots.values() if s.group_lead == lead.gpu]

    def profiling_slots(self) -> Iterator[StageSlot]:
        return (slot for slot in self.slots.values() if slot.sweep is not None)

    # ------------------------------------------------------------------ orders

    def stage_orders(self) -> tuple[StageOrder, ...] | None:
        """Learned orders when every stage has one (the truth), else the named schedule's (None: unknown)."""
        learned: dict[int, StageOrder] = {}
        for slot in self.slots.values():
            if slot.learner.learned is not None:
                learned.setdefault(slot.stage, slot.learner.learned)
        if len(learned) == self.shape.num_stages:
            return tuple(learned[s] for s in range(self.shape.num_stages))
        return self.shape.named_orders()

    # ------------------------------------------------------------------ profile

    def measured_profile(
        self, kept: dict[str, list[OptionEstimate]], scales: dict[str, float] | None = None
    ) -> tuple[Profile, float] | None:
        """The profile measured on every GPU (stages merged across pipelines), and the blocking power.

        `scales`: per profiling GPU, how much energy its whole stage draws for each joule of its own (its
        tensor-parallel GPUs' energy over its own, plus one; 1 without): a stage's energy and blocking power
        are its GPUs' sum."""
        scales = scales or {}
        merged: dict[tuple[int, str, int], list[OptionEstimate]] = {}
        for gpu, estimates in kept.items():
            scale = scales.get(gpu, 1.0)
            for measured in estimates:
                est = (
                    measured
                    if scale == 1.0
                    else dataclasses.replace(measured, energy_j=measured.energy_j * scale)
                )
                if not (est.time_s > 0 and est.energy_j > 0 and math.isfinite(est.energy_j)):
                    continue  # the regression could not separate this option: leave it out
                merged.setdefault((est.key[0], est.key[1], est.clock_mhz), []).append(est)
        if not merged:
            return None
        measurements = []
        for (stage, instruction, clock_mhz), ests in sorted(merged.items()):
            count = sum(e.count for e in ests)
            time_s = sum(e.time_s * e.count for e in ests) / count
            energy_j = sum(e.energy_j * e.count for e in ests) / count
            measurements.append(
                Measurement(stage, Instruction(instruction), int(clock_mhz), float(time_s), float(energy_j))
            )
        blocking = [
            s.estimate.p_block_w * scales.get(s.gpu, 1.0)
            for s in self.slots.values()
            if s.estimate is not None and s.estimate.p_block_w is not None
        ]
        p_block_w = float(statistics.median(blocking)) if blocking else 0.0
        return Profile.from_measurements(measurements, f"online profile of job {self.name}"), p_block_w

    def measured_waiting_w(self, scales: dict[str, float] | None = None) -> tuple[tuple[int, float], ...]:
        """The waiting power by held clock the profiling GPUs measured: per clock, the median over GPUs of
        the blocking power its segment was estimated with (scaled as `measured_profile`), made to rise with
        the clock (an idle GPU draws more at a higher clock) by the least-squares monotone fit, each clock
        weighted by its GPUs (`monotone_fit`): a noisy estimate is pooled with its neighbours, whichever way
        it errs. (Lifting every clock to the highest estimate below it let one noisy low clock, 132 W at
        900 MHz, hold every clock above it at the blocking power: predicted savings 5-7 points low.)"""
        scales = scales or {}
        by_clock: dict[int, list[float]] = {}
        for slot in self.slots.values():
            for clock_mhz, watts in slot.waiting_w_by_clock.items():
                if watts >= 0.0 and math.isfinite(watts):
                    by_clock.setdefault(clock_mhz, []).append(watts * scales.get(slot.gpu, 1.0))
        return pooled_by_clock(by_clock)

    # ------------------------------------------------------------------ frontier and plan

    def set_frontier(self, frontier: Frontier) -> None:
        """The job's frontier; its policies choose among the points it may deploy (`deployable`)."""
        self.frontier = frontier
        self.ramp_clocks = {}
        self.departure = ""  # a new prediction: judged afresh
        self.points = [
            PointSummary(position if p.index is None else p.index, p.predicted_time_s, p.refined_energy_j)
            for position, p in ((k, frontier.points[k]) for k in deployable(frontier.points))
        ]
        self.points_by_index = {p.index: p for p in self.points}

    def point(self, index: int | None) -> PointSummary | None:
        """The frontier point `index` (None when unknown)."""
        return None if index is None else self.points_by_index.get(index)

    def latest_step(self) -> int:
        """The highest step any local pipeline began (-1 before any)."""
        return max((run.latest_step for run in self.runs.values()), default=-1)

    def choose_point(self) -> Deployed | None:
        if not self.points:
            return None
        fastest = Policy("fastest").choose(self.points)
        slowest = max(self.points, key=lambda p: p.time_s)
        all_max_time_s = None if self.all_max is None else self.all_max.time_s
        chosen = self.policy.choose(self.points, all_max_time_s, self.iteration_overhead_s() or 0.0)
        return Deployed(chosen, fastest, slowest)

    def iteration_overhead_s(self) -> float | None:
        """How much longer an iteration at all-max clocks measured than the plan predicts for it: time the
        job spends outside the computations the plan knows (between steps, after the last backward), which
        a `time` target in measured seconds must leave room for. None: not measured (no online profiling)."""
        measured = [s.all_max_iteration_s for s in self.slots.values() if s.all_max_iteration_s is not None]
        if not measured or self.all_max is None:
            return None
        return max(0.0, statistics.median(measured) - self.all_max.time_s)

    def plan_entries(self, stage: int, index: int) -> tuple[PlanEntry, ...]:
        """One stage's plan at frontier point `index`: its computations in order, each with its clock (its
        safe clock throughout when do-no-harm chose it for this stage at this point; its clocks under the
        node's ramp bound once `jobs.ramp_bounding` bounded this point)."""
        assert self.frontier is not None
        order = self.frontier.order[stage]
        clocks = self.frontier.points[index].clocks_mhz[stage]
        if index == self.safe_for_index and stage in self.safe_clocks:
            clocks = (self.safe_clocks[stage],) * len(order)
        if index in self.ramp_clocks:
            clocks = self.ramp_clocks[index][stage]
        return tuple(
            PlanEntry(instruction=Instruction(i), microbatch=mb, chunk=c, freq_mhz=f)
            for (i, mb, c), f in zip(order, clocks, strict=True)
        )

    def node_clocks(self, index: int) -> tuple[ComputationDag, list[int]] | None:
        """Frontier point `index` as its DAG and a clock per node (None before a frontier)."""
        if self.frontier is None:
            return None
        plan = self.frontier.points[index]
        return plan.dag(), list(plan.node_clocks_mhz())

    def plan_times_s(self, stage: int, entries: tuple[PlanEntry, ...]) -> tuple[float, ...] | None:
        """Each of one stage's plan `entries`' expected time at its clock, from the profile; None when the
        profile lacks one (the plan then switches on events only)."""
        if self.profile is None:
            return None
        try:
            return tuple(
                self.profile.lookup(
                    e.chunk * self.shape.num_stages + stage, Instruction(e.instruction), e.freq_mhz
                ).time_s
                for e in entries
            )
        except PerseusError:
            return None

    def plan_slack_s(self, index: int) -> list[list[float]] | None:
        """Per stage, in plan order, how late each computation of point `index` may end without delaying
        the iteration (from the profile's times at the planned clocks); None when not computable."""
        if self.orders is None or self.frontier is None:
            return None
        times = [
            self.plan_times_s(stage, self.plan_entries(stage, index)) for stage in range(len(self.orders))
        ]
        if any(t is None for t in times):
            return None
        try:
            return stage_slack_s(self.shape.dag(self.orders), [t for t in times if t is not None])
        except (PerseusError, ValueError):
            return None

    def plan_document(self) -> dict[str, Any] | None:
        """The deployed point as a `perseus-plan` document (written by `planner.plan`, the one writer)."""
        if self.frontier is None or self.deployed is None:
            return None
        plan = plan_from_frontier(self.frontier, self.deployed.point.index)
        if self.safe_clocks and self.safe_for_index == self.deployed.point.index:
            rows = tuple(
                (self.safe_clocks[stage],) * len(row) if stage in self.safe_clocks else row
                for stage, row in enumerate(plan.clocks_mhz)
            )
            plan = dataclasses.replace(plan, clocks_mhz=rows, refined_energy_j=self.deployed.point.energy_j)
        if self.deployed.point.index in self.ramp_clocks:
            rows = self.ramp_clocks[self.deployed.point.index]
            plan = dataclasses.replace(plan, clocks_mhz=rows, refined_energy_j=self.deployed.point.energy_j)
        return plan_document(plan)

    def frontier_document(self) -> dict[str, Any] | None:
        """The frontier as a `perseus-frontier` document (written by `planner.plan`, the one writer)."""
        return None if self.frontier is None else frontier_to_document(self.frontier)

"""The straggler response of running jobs: detect, share, choose each pipeline's point, switch at a boundary.

Called by the job manager for running jobs only: `step_begin`/`computation_end`/`step_end` from the event
path (bookkeeping, and a decision when a pipeline finishes a step), `tick` from the main loop (other nodes'
facts through the cluster plane), `announce` for `perseusctl straggler` and the client library. Nothing here
waits: GPU plans are installed through `deploy`, etcd is behind the plane's thread.

A pipeline's switch to another frontier point happens at one step boundary on all its stages: the first step
none of them has begun yet; a stage between steps switches at once, a stage inside a step at its step end.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from perseusd.errors import InvalidValueError
from perseusd.jobs.cluster_link import ClusterLink
from perseusd.jobs.job import Job
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.straggling import (
    ActiveStraggler,
    Detector,
    PipelineRun,
    StragglerSettings,
    pick_straggler,
    point_for,
    relative_slowness,
    target_time_s,
)
from perseusd.planner.policy import PointSummary
from perseusd.planner.straggler import outcome

logger = logging.getLogger(__name__)

DEPARTURE_FACTOR = 1.5
"""A plan whose measured iteration time is off its prediction by more than this factor (either way) is
flagged: far beyond a profile's measurement error (a few percent) and the straggler detection's range."""
DEPARTURE_MIN_STEPS = 3
DEPARTS = "departs from its prediction"
"""In a job's `plan_note` when its plan departs (the metrics' `perseus_job_plan_departs` reads it)."""

Deploy = Callable[[Job, StageSlot, int], None]
CLUSTER = "cluster"


class StragglerResponse:
    """Per-pipeline plans of running jobs around their stragglers (see module)."""

    def __init__(self, settings: StragglerSettings, deploy: Deploy, cluster: ClusterLink | None) -> None:
        self.settings = settings
        self._deploy = deploy
        self.cluster = cluster

    # ------------------------------------------------------------------ life cycle

    def start(self, job: Job) -> None:
        """The job (re)starts running `job.deployed`: every local pipeline runs it from now on (the caller
        installs it on every GPU, then calls `decide`)."""
        assert job.deployed is not None
        index = job.deployed.point.index
        for pipeline, slots in job.pipelines().items():
            run = job.runs.get(pipeline)
            if run is None:
                run = PipelineRun(pipeline, len(slots), Detector(self.settings))
                job.runs[pipeline] = run
            run.point_index, run.pending = index, None
            run.plan_since_step = job.latest_step() + 1
            run.compute_times_s.clear()

    def slot_joined(self, job: Job, slot: StageSlot) -> int | None:
        """The point a GPU joining a running job runs (its pipeline's)."""
        run = job.runs.get(slot.pipeline)
        if run is None and job.deployed is not None:
            gpus = sum(1 for s in job.slots.values() if s.pipeline == slot.pipeline)
            run = PipelineRun(slot.pipeline, gpus, Detector(self.settings))
            run.point_index = job.deployed.point.index
            job.runs[slot.pipeline] = run
        return run.target_index() if run is not None else None

    def forget(self, job: Job) -> None:
        if self.cluster is not None:
            self.cluster.forget(job.cluster_key)

    # ------------------------------------------------------------------ events

    def step_begin(self, job: Job, slot: StageSlot, step: int, t_ns: int) -> None:
        run = job.runs.get(slot.pipeline)
        if run is None:
            return
        run.step_begin(step, t_ns)
        if run.pending is not None and step >= run.pending[1] and slot.plan_index != run.pending[0]:
            self._switch_slot(job, run, slot)  # it missed its boundary: switch now rather than never

    def computation_end(self, job: Job, slot: StageSlot, t_ns: int) -> None:
        run = job.runs.get(slot.pipeline)
        if run is not None:
            run.computation_end(slot.current_step, t_ns)

    def step_end(self, job: Job, slot: StageSlot, step: int) -> None:
        run = job.runs.get(slot.pipeline)
        if run is None:
            return
        if run.pending is not None and step + 1 >= run.pending[1] and slot.plan_index != run.pending[0]:
            self._switch_slot(job, run, slot)
        compute_s = run.stage_ended(step)
        if compute_s is not None:
            self._pipeline_step_done(job, run, step)

    def _pipeline_step_done(self, job: Job, run: PipelineRun, step: int) -> None:
        point = job.point(run.point_index)
        if point is None:
            return
        self._count_saving(job, run, point)
        if job.span is not None:
            return  # a spanning job's leader detects stragglers from every node's report
        compute_s = run.compute_time_s()
        if self.cluster is not None and compute_s is not None and job.deployed is not None:
            fastest_s, slowest_s = job.deployed.fastest.time_s, job.deployed.slowest.time_s
            self.cluster.publish(job.cluster_key, run.pipeline, compute_s, fastest_s, slowest_s, point.time_s)
        if self._detect(job, run, step):
            self.decide(job)

    def _count_saving(self, job: Job, run: PipelineRun, point: PointSummary) -> None:
        if job.all_max is None or run.pending is not None:
            return
        if self._departs(job, run, point):
            return  # its prediction does not hold: no predicted saving accrues
        straggler = job.straggler
        wait_s = None
        if straggler is not None and straggler.pipeline != run.pipeline:
            wait_s = target_time_s(straggler, job.deployed.fastest if job.deployed else None)
        stages, p_block_w = job.shape.num_stages, job.p_block_w
        baseline = outcome(job.all_max, wait_s, stages, p_block_w).energy_j
        share = 1.0  # of the pipeline's stages, those on this node (a spanning job's others count theirs)
        if job.span is not None:
            share = len({s.stage for s in job.slots.values() if s.pipeline == run.pipeline}) / stages
        job.energy_saved_j += share * (baseline - outcome(point, wait_s, stages, p_block_w).energy_j)

    def _departs(self, job: Job, run: PipelineRun, point: PointSummary) -> bool:
        """Whether the pipeline's measured iterations depart from the plan's prediction by more than a factor
        `DEPARTURE_FACTOR` (faster: the profile cannot be this run's; slower without a straggler announced or
        detected); flagged once in `departure` (jobs, metrics) and the log."""
        if job.departure:
            return True
        compute_s = run.compute_time_s()
        if compute_s is None or len(run.compute_times_s) < DEPARTURE_MIN_STEPS or point.time_s <= 0:
            return False
        ratio = compute_s / point.time_s
        straggling = job.straggler is not None and job.straggler.pipeline == run.pipeline
        if 1 / DEPARTURE_FACTOR <= ratio <= DEPARTURE_FACTOR or (ratio > 1 and straggling):
            return False
        job.departure = (
            f"measured {compute_s:.4g} s per iteration against {point.time_s:.4g} s planned "
            f"(x{ratio:.2f}): the plan {DEPARTS} (is the profile this job's?); predicted savings stop "
            "accruing"
        )
        logger.warning("job %s, pipeline %d: %s", job.name, run.pipeline, job.departure)
        return True

    # ------------------------------------------------------------------ detection

    def _detect(self, job: Job, run: PipelineRun, step: int) -> bool:
        """One finished step of a local pipeline through its detector; True when the job's facts changed."""
        points = job.points_by_index
        own = run.slowness(points, last_step=True)  # each step counts once toward the hysteresis
        if own is None:
            return False
        others = [s for p, r in job.runs.items() if p != run.pipeline and (s := r.slowness(points))]
        if job.remote is not None and job.remote.usable:
            others += [f.slowness for p, f in job.remote.pipelines.items() if p not in job.runs]
        relative = relative_slowness(own, others)
        if relative is None or step < job.detect_from_step:  # settling after a re-plan
            return False
        if not run.detector.observe(relative, calm=job.straggler is None):
            return False
        if run.detector.straggling:
            factor = run.detector.factor
            job.detected[run.pipeline] = ActiveStraggler(run.pipeline, factor, "detected", step)
            logger.info(
                "job %s: pipeline %d straggles (x%.3f) at step %d", job.name, run.pipeline, factor, step
            )
            if self.cluster is not None and run.pipeline not in job.announced:
                self.cluster.announce(job.cluster_key, run.pipeline, factor)
        else:
            job.detected.pop(run.pipeline, None)
            logger.info("job %s: pipeline %d recovered at step %d", job.name, run.pipeline, step)
            if self.cluster is not None and run.pipeline not in job.announced:
                self.cluster.clear(job.cluster_key, run.pipeline)
        return True

    def announce(self, job: Job, pipeline: int, factor: float | None) -> bool:
        """An operator's or framework's announcement (None: withdraw it); True if shared with the cluster."""
        if factor is not None and not (math.isfinite(factor) and factor >= 1.0):
            raise InvalidValueError("must be a number >= 1", "factor")
        if factor is None:
            job.announced.pop(pipeline, None)
        else:
            job.announced[pipeline] = ActiveStraggler(
                pipeline, factor, "announced", max(0, job.latest_step())
            )
        shared = False
        if self.cluster is not None:
            if factor is not None:
                shared = self.cluster.announce(job.cluster_key, pipeline, factor)
            elif pipeline not in job.detected:
                self.cluster.clear(job.cluster_key, pipeline)
                shared = True
            else:
                shared = self.cluster.announce(job.cluster_key, pipeline, job.detected[pipeline].factor)
        if job.deployed is not None:
            self.decide(job)
        return shared

    # ------------------------------------------------------------------ the cluster

    def tick(self, job: Job) -> None:
        """From the main loop: read the other nodes' view of a running job; re-decide when it changed."""
        if self.cluster is None or job.span is not None:
            return
        remote = self.cluster.remote(job.cluster_key)
        was_usable = job.remote is not None and job.remote.usable
        job.remote = remote
        known = job.remote_stragglers
        current = {p: f for p, f in remote.stragglers.items() if p not in job.runs} if remote.usable else {}
        changed = set(current) != set(known) or any(known[p].factor != f for p, f in current.items())
        if changed:
            since = max(0, job.latest_step())
            job.remote_stragglers = {
                p: known[p]
                if p in known and known[p].factor == f
                else ActiveStraggler(p, f, "cluster", since)
                for p, f in current.items()
            }
        if changed or was_usable != remote.usable:
            if not remote.usable:
                logger.warning(
                    "job %s: cluster view %s: back to the no-slowdown plan", job.name, remote.state
                )
            self.decide(job)

    # ------------------------------------------------------------------ decisions

    def decide(self, job: Job) -> None:
        """Pick the straggler to plan around and move every local pipeline to its point for it."""
        deployed = job.deployed
        if deployed is None or job.span is not None:
            return  # a spanning job's points are its leader's decision
        candidates = [*job.announced.values(), *job.detected.values(), *job.remote_stragglers.values()]
        if self.cluster is not None and (job.remote is None or not job.remote.usable):
            candidates = []  # this node's lease lapsed: the no-slowdown plan, whatever anyone said
        straggler = pick_straggler(candidates)
        if straggler != job.straggler:
            logger.info("job %s: planning around %s", job.name, straggler or "no straggler")
        job.straggler = straggler
        replanned = False
        for run in job.runs.values():
            point = point_for(
                run.pipeline,
                straggler,
                job.points,
                deployed.point,
                deployed.fastest,
                job.shape.num_stages,
                job.p_block_w,
            )
            point = capped(job, point)
            if point.index != run.target_index():
                self._schedule(job, run, point.index)
                replanned = True
        if replanned:
            self._settle(job)

    def _settle(self, job: Job) -> None:
        """A re-plan: every detector starts over once the new plans have run `hold_iterations` steps."""
        job.replans += 1
        job.detect_from_step = job.latest_step() + 1 + self.settings.hold_iterations
        for run in job.runs.values():
            run.detector.restart()

    def _schedule(self, job: Job, run: PipelineRun, index: int) -> None:
        """Switch `run` to point `index` from the first step none of its stages has begun."""
        if index == run.point_index:
            run.pending = None
            return
        run.pending = (index, run.latest_step + 1)
        for slot in job.slots.values():
            if slot.pipeline == run.pipeline and not slot.in_step and slot.current_step <= run.latest_step:
                self._switch_slot(job, run, slot)

    def schedule_at(self, job: Job, run: PipelineRun, index: int, from_step: int) -> None:
        """Switch `run` to point `index` from step `from_step` on (the step after its latest when that one
        has begun already): a spanning job's stages on every node switch at the same step."""
        if index == run.point_index:
            run.pending = None
            return
        start = max(from_step, run.latest_step + 1)
        run.pending = (index, start)
        for slot in job.slots.values():
            if slot.pipeline == run.pipeline and not slot.in_step and slot.current_step + 1 >= start:
                self._switch_slot(job, run, slot)

    def _switch_slot(self, job: Job, run: PipelineRun, slot: StageSlot) -> None:
        assert run.pending is not None
        index, from_step = run.pending
        self._deploy(job, slot, index)
        stages = [s for s in job.slots.values() if s.pipeline == run.pipeline]
        if all(s.plan_index == index for s in stages):
            run.point_index, run.pending, run.plan_since_step = index, None, from_step
            run.compute_times_s.clear()  # times of the previous plan would read as a slowness change


def capped(job: Job, point: PointSummary) -> PointSummary:
    """`point`, or the node power cap's point when that is slower: the cap is a constraint on top of what the
    policy and the straggler slack choose (a slower point of the frontier draws less power)."""
    cap = job.point(job.cap_index)
    return cap if cap is not None and cap.time_s > point.time_s else point

"""Running jobs as the node cap sees them (`JobLoad`): each frontier point's power on each of the job's GPUs,
from the job's profile and the point's clocks.

A GPU running stage s at a point draws, averaged over an iteration, (its computations' energy + blocking
power x the rest of the iteration) / the iteration time; its peak is its most power-hungry computation
(energy / time at its clock). The job's worst window (`perseusd.power.aliasing`) comes from the point's
schedule: each local pipeline's stages on this node, summed over the pipelines. Jobs not running a plan
(profiling, solving) have no points: their GPUs are unmanaged and held by their power limits alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from perseusd.errors import PerseusError
from perseusd.jobs.job import Job
from perseusd.jobs.states import RUNNING
from perseusd.planner.below_clock import extrapolate_below
from perseusd.planner.dag import ComputationDag, Instruction, from_stage_orders
from perseusd.power.aliasing import periodic_worst_window_w, schedule
from perseusd.power.allocate import DEFAULT_PRIORITY, stage_power_w
from perseusd.power.cap_inputs import CapPoint, JobLoad, candidate_indices
from perseusd.power.limit_model import LimitModel, LocalPipeline, Option

logger = logging.getLogger(__name__)


MAX_CAP_POINTS = 64
"""Frontier points the cap considers per job (spread evenly in time, with the job's current points): a fine
frontier has thousands, and each costs a schedule to model."""


@dataclass
class _Cached:
    frontier: object
    gpus: tuple[str, ...]
    dag: ComputationDag
    points: dict[int, CapPoint]
    models: dict[int, LimitModel | None] = field(default_factory=dict)


class JobLoads:
    """Running jobs as `JobLoad`s; each job's points are computed once per frontier and set of GPUs."""

    def __init__(self, window_s: float = 1.0) -> None:
        self.window_s = window_s
        self._cache: dict[str, _Cached] = {}

    def loads(self, jobs: Iterable[Job], priorities: Mapping[str, int]) -> list[JobLoad]:
        """Every running job with a frontier and a profile (others are left out: limits alone hold them)."""
        loads = []
        seen = set()
        for job in jobs:
            if job.state != RUNNING or job.deployed is None or job.frontier is None or job.profile is None:
                continue
            base = _base_index(job)
            try:
                points = self._job_points(job, base)
            except (PerseusError, KeyError, IndexError, ValueError) as exc:
                logger.warning("job %s: no power model for the cap (%s): limits alone hold it", job.name, exc)
                continue
            seen.add(job.name)
            priority = priorities.get(f"{job.uid}/{job.name}", DEFAULT_PRIORITY)  # node_cap.priority_key
            loads.append(JobLoad(job.name, priority, points, base, limit_model=self._modeller(job)))
        for name in set(self._cache) - seen:
            del self._cache[name]
        return loads

    def _job_points(self, job: Job, base: int) -> tuple[CapPoint, ...]:
        gpus = tuple(sorted(job.slots))
        cached = self._cache.get(job.name)
        if cached is None or cached.frontier is not job.frontier or cached.gpus != gpus:
            dag = _job_dag(job)
            cached = self._cache[job.name] = _Cached(job.frontier, gpus, dag, {})
            for index in candidate_indices(job.points, MAX_CAP_POINTS):
                cached.points[index] = self._point(job, cached.dag, index)
        if base not in cached.points:  # a straggler or policy moved the job off the candidates
            cached.points[base] = self._point(job, cached.dag, base)
        return tuple(cached.points.values())

    def _modeller(self, job: Job) -> Callable[[int], LimitModel | None]:
        """The job's limit model at a point, built when first asked for (only when no point fits)."""
        cached = self._cache[job.name]

        def model_at(index: int) -> LimitModel | None:
            if index not in cached.models:
                try:
                    cached.models[index] = _limit_model(job, cached.dag, index, self.window_s)
                except (PerseusError, KeyError, IndexError, ValueError) as exc:
                    logger.warning("job %s: no power-limit model (%s): strict limits hold it", job.name, exc)
                    cached.models[index] = None
            return cached.models[index]

        return model_at

    def _point(self, job: Job, dag: ComputationDag, index: int) -> CapPoint:
        summary = job.points_by_index[index]
        return _cap_point(job, dag, index, summary.time_s, self.window_s)


def _base_index(job: Job) -> int:
    """The fastest point any local pipeline would run uncapped (the policy's, or a straggler's fastest)."""
    assert job.deployed is not None
    base = job.deployed.point
    if job.straggler is not None and job.straggler.pipeline in job.runs:
        base = job.deployed.fastest
    return base.index


def _job_dag(job: Job) -> ComputationDag:
    """The DAG of the job's frontier: its nodes numbered stage by stage in the frontier's order."""
    assert job.frontier is not None
    shape = job.shape
    return from_stage_orders(job.frontier.order, shape.num_microbatches, shape.chunks, shape.schedule)


def _cap_point(job: Job, dag: ComputationDag, index: int, time_s: float, window_s: float) -> CapPoint:
    """Each GPU's average and peak power at point `index`, and the worst window of the job's local power."""
    assert job.profile is not None
    durations = [0.0] * dag.num_computations
    powers = [0.0] * dag.num_computations
    stage_costs: list[list[tuple[float, float]]] = []
    for stage, nodes in enumerate(dag.stage_orders):
        costs = []
        for node, entry in zip(nodes, job.plan_entries(stage, index), strict=True):
            measured = job.profile.lookup(
                entry.chunk * job.shape.num_stages + stage, Instruction(entry.instruction), entry.freq_mhz
            )
            costs.append((measured.time_s, measured.energy_j))
            durations[node] = measured.time_s
            powers[node] = measured.energy_j / measured.time_s if measured.time_s > 0 else 0.0
        stage_costs.append(costs)
    stage_power = [stage_power_w(costs, time_s, job.p_block_w) for costs in stage_costs]
    period_s, segments = schedule(dag, durations, powers, job.p_block_w)
    window_w = 0.0
    for slots in job.pipelines().values():  # each local pipeline's stages draw together
        local = [segment for slot in slots for segment in segments[slot.stage]]
        window_w += periodic_worst_window_w(local, period_s, job.p_block_w * len(slots), window_s)
    power = {slot.gpu: stage_power[slot.stage][0] for slot in job.slots.values()}
    peak = {slot.gpu: stage_power[slot.stage][1] for slot in job.slots.values()}
    return CapPoint(index, time_s, power, peak, window_w)


def _limit_model(job: Job, dag: ComputationDag, index: int, window_s: float) -> LimitModel:
    """Each computation at its planned clock and every lower clock of the profile, then below the lowest
    profiled clock at the GPUs' lower clocks as the board models them (`perseusd.planner.below_clock`, the
    same fit the simulated boards run); the local pipelines."""
    assert job.profile is not None
    supported = {c for slot in job.slots.values() for c in slot.supported_clocks_mhz}
    options: list[list[Option]] = [[] for _ in range(dag.num_computations)]
    for stage, nodes in enumerate(dag.stage_orders):
        for node, entry in zip(nodes, job.plan_entries(stage, index), strict=True):
            virtual = entry.chunk * job.shape.num_stages + stage
            measured = job.profile.options(virtual, Instruction(entry.instruction))
            lower = sorted((m for m in measured if m.freq_mhz <= entry.freq_mhz), key=lambda m: -m.freq_mhz)
            options[node] = [(m.time_s, m.energy_j / m.time_s) for m in lower if m.time_s > 0]
            by_clock = {m.freq_mhz: (m.time_s, m.energy_j) for m in measured}
            below = extrapolate_below(by_clock, supported, job.p_block_w)
            options[node] += [(t, e / t) for _, (t, e) in sorted(below.items(), reverse=True)]
    pipelines = []
    for slots in job.pipelines().values():
        gpus: list[str | None] = [None] * dag.num_stages
        for slot in slots:
            gpus[slot.stage] = slot.gpu
        pipelines.append(LocalPipeline(tuple(gpus)))
    return LimitModel(dag, options, pipelines, job.p_block_w, window_s)

"""The analytic straggler mode at scale: a data-parallel job of many pipelines, one of which straggles.

A job runs P identical pipelines (data parallel) of S stages; each stage is a tensor-parallel group of TP GPUs
that run the same computations at the same clocks, so a stage's energy is TP times the profiled per-GPU
energy and the job has P x S x TP GPUs. With the global batch fixed (GPT-3 175B in the Perseus paper: 1,536
sequences, microbatch size 1), a pipeline runs M = global batch / P microbatches per iteration.

One pipeline straggles by a factor k: the iteration of the whole job ends at T' = k x T, where T is the
all-max iteration time of one pipeline (the same T' for Perseus and for all-max, as in
`perseusd.planner.straggler`). Every GPU draws the blocking power P_block whenever it is not computing
before T'.

- Perseus: the straggler pipeline runs its fastest frontier point (it is the one the others wait for); every
  other pipeline moves to the frontier point with time <= T' of least energy, waiting included
  (`choose_point`).
- All-max under the same straggler: every pipeline, the straggler included, runs all-max and waits until T'.

The saving is 1 - E_perseus / E_all_max over the whole job. Percentages do not depend on TP; absolute energies
are per iteration of the whole job. The straggler's own computations are unchanged by the slowdown (its extra
time is counted at P_block, exactly as for every other pipeline); counting it instead as unchanged energy or
as energy scaled by k moves the totals by less than 0.2 percentage points on the bundled profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.errors import PlanningError
from perseusd.planner.baselines import CandidatePoint, all_max
from perseusd.planner.dag import build_dag
from perseusd.planner.profile import Profile
from perseusd.planner.solver import FrontierPoint, SolverParams, solve_frontier
from perseusd.planner.straggler import TimedPoint, choose_point, fastest_point, outcome

GLOBAL_BATCH = 1536
"""Sequences per iteration of the job (the Perseus paper's GPT-3 175B and Bloom 176B emulation)."""

TENSOR_PARALLEL = 8
"""GPUs per pipeline stage (tensor parallelism) in the published emulation."""

PIPELINE_COUNTS: tuple[int, ...] = (16, 32, 64, 128)
"""Data-parallel pipelines of the published emulation: 1,024 to 8,192 GPUs with 8 stages x TP 8."""

SCALE_FACTORS: tuple[float, ...] = (1.05, 1.1, 1.2, 1.5)
"""Straggler factors of the published comparison."""


@dataclass(frozen=True)
class PipelineFrontier:
    """One pipeline's measured frontier, its fastest point and its all-max point (per GPU of a TP group)."""

    num_stages: int
    num_microbatches: int
    p_block_w: float
    points: tuple[TimedPoint, ...]
    all_max: TimedPoint

    @property
    def fastest(self) -> TimedPoint:
        """The point the pipeline runs without a straggler, and the straggler pipeline runs with one."""
        return fastest_point(self.points)

    @property
    def intrinsic_saving_pct(self) -> float:
        """The saving of the fastest point against all-max without a straggler (intrinsic bloat removed)."""
        return 100.0 * (1.0 - self.fastest.energy_j / self.all_max.energy_j)


@dataclass(frozen=True)
class JobEnergy:
    """One job iteration with one straggler pipeline: Perseus against all-max under the same straggler."""

    num_pipelines: int
    num_gpus: int
    num_microbatches: int
    factor: float
    time_s: float
    """The job's iteration time with Perseus (T', or a plan's time when slower)."""
    energy_j: float
    all_max_time_s: float
    all_max_energy_j: float
    others_plan_time_s: float
    """The iteration time of the plan every non-straggler pipeline moves to."""

    @property
    def saving_pct(self) -> float:
        """The job's saving against all-max under the same straggler, in percent."""
        return 100.0 * (1.0 - self.energy_j / self.all_max_energy_j)

    @property
    def slowdown_pct(self) -> float:
        """How much longer the job's iteration is than all-max's under the same straggler, in percent."""
        return 100.0 * (self.time_s / self.all_max_time_s - 1.0)

    def to_json(self) -> dict[str, float | int]:
        """One row of `perseusctl stragglers --json`."""
        return {
            "pipelines": self.num_pipelines,
            "gpus": self.num_gpus,
            "microbatches": self.num_microbatches,
            "factor": self.factor,
            "saving_pct": self.saving_pct,
            "slowdown_pct": self.slowdown_pct,
            "time_s": self.time_s,
            "energy_j": self.energy_j,
            "all_max_time_s": self.all_max_time_s,
            "all_max_energy_j": self.all_max_energy_j,
            "others_plan_time_s": self.others_plan_time_s,
        }


def microbatches_for(num_pipelines: int, global_batch: int = GLOBAL_BATCH) -> int:
    """Microbatches per pipeline (microbatch size 1) when `global_batch` is split over the pipelines."""
    if num_pipelines < 1 or global_batch % num_pipelines:
        raise PlanningError(
            f"a global batch of {global_batch} cannot be split evenly over {num_pipelines} pipelines"
        )
    return global_batch // num_pipelines


def measured_frontier(
    profile: Profile,
    points: Sequence[FrontierPoint],
    num_stages: int,
    num_microbatches: int,
    p_block_w: float,
) -> PipelineFrontier:
    """A 1F1B pipeline's frontier from solved points, re-evaluated with measured times and energies."""
    if not points:
        raise PlanningError("the frontier is empty: nothing to choose from")
    dag = build_dag("1f1b", num_stages, num_microbatches, 1)
    measured = tuple(CandidatePoint(p.refined_time_s, p.refined_energy_j, p.clocks_mhz) for p in points)
    return PipelineFrontier(
        num_stages, num_microbatches, p_block_w, measured, all_max(dag, profile, p_block_w)
    )


def solve_pipeline(
    profile: Profile, num_stages: int, num_microbatches: int, p_block_w: float, unit_time_s: float = 0.001
) -> PipelineFrontier:
    """Solve one 1F1B pipeline's frontier (`solve_frontier`) and measure it (`measured_frontier`)."""
    dag = build_dag("1f1b", num_stages, num_microbatches, 1)
    points = list(solve_frontier(dag, profile, SolverParams(unit_time_s, p_block_w)))
    return measured_frontier(profile, points, num_stages, num_microbatches, p_block_w)


def job_energy(
    frontier: PipelineFrontier, num_pipelines: int, factor: float, tensor_parallel: int = TENSOR_PARALLEL
) -> JobEnergy:
    """The job's iteration energy with one pipeline of `num_pipelines` straggling by `factor` (see module)."""
    if num_pipelines < 1 or tensor_parallel < 1 or not factor >= 1.0:
        raise PlanningError(
            f"need at least one pipeline, TP >= 1 and a factor >= 1 (got {num_pipelines}, "
            f"{tensor_parallel}, {factor})"
        )
    stages, p_block_w = frontier.num_stages, frontier.p_block_w
    wait_until_s = factor * frontier.all_max.time_s
    others = choose_point(frontier.points, wait_until_s, stages, p_block_w)
    # The iteration ends with the slowest pipeline; the fastest point can be a hair slower than all-max.
    job_time_s = max(wait_until_s, frontier.fastest.time_s, others.time_s)
    straggler_j = outcome(frontier.fastest, job_time_s, stages, p_block_w).energy_j
    others_j = (num_pipelines - 1) * outcome(others, job_time_s, stages, p_block_w).energy_j
    baseline = outcome(frontier.all_max, wait_until_s, stages, p_block_w)
    return JobEnergy(
        num_pipelines=num_pipelines,
        num_gpus=num_pipelines * stages * tensor_parallel,
        num_microbatches=frontier.num_microbatches,
        factor=factor,
        time_s=job_time_s,
        energy_j=tensor_parallel * (straggler_j + others_j),
        all_max_time_s=baseline.time_s,
        all_max_energy_j=tensor_parallel * num_pipelines * baseline.energy_j,
        others_plan_time_s=others.time_s,
    )


def scale_table(
    frontiers: Sequence[tuple[int, PipelineFrontier]],
    factors: Sequence[float] = SCALE_FACTORS,
    tensor_parallel: int = TENSOR_PARALLEL,
) -> list[JobEnergy]:
    """Every (pipeline count, frontier) pair at every factor, in the order given (pipelines, then factors)."""
    return [job_energy(f, p, k, tensor_parallel) for p, f in frontiers for k in factors]

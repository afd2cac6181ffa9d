"""Baseline planners on the same DAG and energy model as Perseus (see `shared/docs/reference-numbers.md`).

Every baseline is evaluated with measured profile values and the blocking power (`evaluate.evaluate_clocks`)
and returns candidate points `(time_s, energy_j, clocks_mhz)`:

- all-max: every computation at its maximum clock (the no-optimisation baseline);
- ZeusGlobal: one clock for every computation, swept over the clocks common to every (stage, instruction);
- ZeusPerStage: one clock per stage, matched to the heaviest stage's forward time;
- EnvPipe: minimum-energy clocks off the outer envelope, raised along critical paths (one point).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perseusd.errors import PlanningError
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.evaluate import all_max_clocks, evaluate_clocks
from perseusd.planner.profile import Profile


@dataclass(frozen=True)
class CandidatePoint:
    """One plan of a baseline and its measured iteration time and energy."""

    time_s: float
    energy_j: float
    clocks_mhz: tuple[int, ...]


def evaluate_point(
    dag: ComputationDag, profile: Profile, clocks_mhz: Sequence[int], p_block_w: float
) -> CandidatePoint:
    """The measured time and energy of a plan, as a candidate point."""
    evaluation = evaluate_clocks(dag, profile, clocks_mhz, p_block_w)
    return CandidatePoint(evaluation.time_s, evaluation.energy_j, tuple(clocks_mhz))


def pareto_subset(points: Iterable[CandidatePoint]) -> list[CandidatePoint]:
    """The points no other point beats in both time and energy, fastest first (energy strictly decreasing).

    Of points with equal time only the lowest-energy one is kept (the first one on ties).
    """
    ordered = sorted(points, key=lambda p: (p.time_s, p.energy_j))
    frontier: list[CandidatePoint] = []
    for point in ordered:
        if not frontier or point.energy_j < frontier[-1].energy_j:
            if frontier and point.time_s == frontier[-1].time_s:
                continue
            frontier.append(point)
    return frontier


def all_max(dag: ComputationDag, profile: Profile, p_block_w: float) -> CandidatePoint:
    """Every computation at the maximum clock of its (stage, instruction)."""
    return evaluate_point(dag, profile, all_max_clocks(dag, profile), p_block_w)


def common_clocks_mhz(dag: ComputationDag, profile: Profile) -> tuple[int, ...]:
    """The clocks measured for every (stage, instruction) the DAG runs, highest first."""
    keys = {(dag.virtual_stage(n), c.instruction) for n, c in enumerate(dag.computations)}
    sets = [{m.freq_mhz for m in profile.options(stage, instruction)} for stage, instruction in sorted(keys)]
    common = set.intersection(*sets) if sets else set()
    return tuple(sorted(common, reverse=True))


def zeus_global_sweep(dag: ComputationDag, profile: Profile, p_block_w: float) -> list[CandidatePoint]:
    """ZeusGlobal's whole sweep: one point per common clock f (every computation at f), highest f first."""
    clocks = common_clocks_mhz(dag, profile)
    if not clocks:
        raise PlanningError(f"profile {profile.source} has no clock measured for every stage and instruction")
    return [evaluate_point(dag, profile, [f] * dag.num_computations, p_block_w) for f in clocks]


def zeus_global(dag: ComputationDag, profile: Profile, p_block_w: float) -> list[CandidatePoint]:
    """The ZeusGlobal frontier: the Pareto subset of the one-clock sweep, fastest first."""
    return pareto_subset(zeus_global_sweep(dag, profile, p_block_w))


def zeus_global_select(
    points: Sequence[CandidatePoint], eta: float, num_gpus: int, p_max_w: float
) -> CandidatePoint:
    """Zeus's choice among `points`: the minimum of eta*E + (1 - eta)*W*P_max*T (first on ties).

    Args:
        points: candidate points (e.g. the ZeusGlobal frontier).
        eta: weight of energy against time, in [0, 1].
        num_gpus: W, the number of GPUs of the pipeline.
        p_max_w: P_max, the GPUs' maximum power limit.
    """
    if not 0.0 <= eta <= 1.0:
        raise PlanningError(f"eta must be within [0, 1] (got {eta})")
    if not points:
        raise PlanningError("no candidate points to choose from")
    return min(points, key=lambda p: eta * p.energy_j + (1.0 - eta) * num_gpus * p_max_w * p.time_s)


def _stage_clocks(dag: ComputationDag, profile: Profile, stage: int) -> tuple[int, ...]:
    """The clocks measured for every computation of a physical stage (all chunks, F and B), highest first."""
    keys = {(dag.virtual_stage(n), dag.computations[n].instruction) for n in dag.stage_orders[stage]}
    sets = [{m.freq_mhz for m in profile.options(v, i)} for v, i in keys]
    clocks = tuple(sorted(set.intersection(*sets), reverse=True))
    if not clocks:
        raise PlanningError(f"stage {stage} has no clock measured for both its forward and its backward")
    return clocks


def _forward_time_s(dag: ComputationDag, profile: Profile, stage: int, freq_mhz: int) -> float:
    """Forward time of a physical stage at one clock: the sum over its model chunks."""
    return sum(
        profile.lookup(chunk * dag.num_stages + stage, Instruction.FORWARD, freq_mhz).time_s
        for chunk in range(dag.num_chunks)
    )


def zeus_per_stage(dag: ComputationDag, profile: Profile, p_block_w: float) -> list[CandidatePoint]:
    """The ZeusPerStage frontier (Pareto subset, fastest first).

    The heaviest stage h has the longest forward time at its maximum clock (the lowest stage on ties). For
    each clock f_h of h, highest first, every other stage gets the clock whose forward time is closest to
    h's forward time at f_h (the higher clock on ties); each stage runs F and B at its one clock.
    """
    return pareto_subset(zeus_per_stage_sweep(dag, profile, p_block_w))


def zeus_per_stage_sweep(dag: ComputationDag, profile: Profile, p_block_w: float) -> list[CandidatePoint]:
    """Every ZeusPerStage plan, one per clock of the heaviest stage, highest first."""
    stages = range(dag.num_stages)
    clocks = {s: _stage_clocks(dag, profile, s) for s in stages}
    heaviest = max(stages, key=lambda s: (_forward_time_s(dag, profile, s, clocks[s][0]), -s))
    points = []
    for f_h in clocks[heaviest]:
        target_s = _forward_time_s(dag, profile, heaviest, f_h)
        per_stage = {s: _closest_clock(dag, profile, s, clocks[s], target_s) for s in stages}
        per_stage[heaviest] = f_h
        node_clocks = [per_stage[c.stage] for c in dag.computations]
        points.append(evaluate_point(dag, profile, node_clocks, p_block_w))
    return points


def _closest_clock(
    dag: ComputationDag, profile: Profile, stage: int, clocks_mhz: Sequence[int], target_s: float
) -> int:
    """The clock of `stage` whose forward time is closest to `target_s` (the higher clock on ties)."""
    return min(clocks_mhz, key=lambda f: (abs(_forward_time_s(dag, profile, stage, f) - target_s), -f))

"""The EnvPipe baseline (USENIX ATC '23) on the same DAG and energy model as Perseus.

Start every computation at its minimum-energy clock, except the outer envelope (every computation of the
last stage, and the first forward and the last backward of each stage), which runs at its maximum clock.
Then repeatedly take a critical path (the longest path with measured times) and raise by one clock step every
computation on it that sits at the lowest clock among the path's computations that can still go up, until
the critical path lies entirely on the envelope. When the last stage is not the heaviest the envelope is never
reached; the run then stops when nothing on the critical path can be raised (no progress), and in any case
after a bounded number of iterations (each iteration raises at least one clock, so the total number of clock
steps bounds it). EnvPipe produces one plan and cannot use straggler slack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.planner.baselines import CandidatePoint, evaluate_point
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.profile import Profile


@dataclass(frozen=True)
class EnvPipeResult:
    """EnvPipe's plan and how the run ended."""

    point: CandidatePoint
    iterations: int
    reached_envelope: bool


def envelope_nodes(dag: ComputationDag) -> frozenset[int]:
    """The outer envelope: every node of the last stage, and each stage's first forward and last backward."""
    nodes = set(dag.stage_orders[-1])
    for ids in dag.stage_orders:
        forwards = [n for n in ids if dag.computations[n].instruction is Instruction.FORWARD]
        backwards = [n for n in ids if dag.computations[n].instruction is Instruction.BACKWARD]
        nodes.update(forwards[:1] + backwards[-1:])
    return frozenset(nodes)


def critical_path(dag: ComputationDag, durations_s: Sequence[float]) -> list[int]:
    """One longest path through the DAG, source to sink (ties go to the lowest node id)."""
    finish = [0.0] * dag.num_computations
    parent: list[int | None] = [None] * dag.num_computations
    for node in dag.topological_order:
        preds = dag.predecessors[node]
        if preds:
            best = max(sorted(preds), key=lambda p: finish[p])
            parent[node] = best
            finish[node] = finish[best] + durations_s[node]
        else:
            finish[node] = durations_s[node]
    current: int | None = max(range(dag.num_computations), key=lambda n: finish[n])
    path: list[int] = []
    while current is not None:
        path.append(current)
        current = parent[current]
    return path[::-1]


def _ladders(dag: ComputationDag, profile: Profile) -> list[tuple[int, ...]]:
    """Per node, its measured clocks in increasing order."""
    cache: dict[tuple[int, Instruction], tuple[int, ...]] = {}
    ladders = []
    for node, comp in enumerate(dag.computations):
        key = (dag.virtual_stage(node), comp.instruction)
        if key not in cache:
            cache[key] = tuple(sorted(m.freq_mhz for m in profile.options(*key)))
        ladders.append(cache[key])
    return ladders


def _min_energy_clock(profile: Profile, stage: int, instruction: Instruction) -> int:
    """The clock with the lowest energy per execution (the higher clock on ties)."""
    return min(profile.options(stage, instruction), key=lambda m: (m.energy_j, -m.freq_mhz)).freq_mhz


def initial_clocks(dag: ComputationDag, profile: Profile) -> list[int]:
    """EnvPipe's start: the envelope at maximum clocks, everything else at its minimum-energy clock."""
    envelope = envelope_nodes(dag)
    ladders = _ladders(dag, profile)
    return [
        ladders[n][-1] if n in envelope else _min_energy_clock(profile, dag.virtual_stage(n), c.instruction)
        for n, c in enumerate(dag.computations)
    ]


def envpipe_run(
    dag: ComputationDag, profile: Profile, p_block_w: float, max_iterations: int | None = None
) -> EnvPipeResult:
    """Run EnvPipe and say how it ended (envelope reached, or no progress / iteration bound)."""
    ladders = _ladders(dag, profile)
    envelope = envelope_nodes(dag)
    clocks = initial_clocks(dag, profile)
    times = {
        (n, f): profile.lookup(dag.virtual_stage(n), c.instruction, f).time_s
        for n, c in enumerate(dag.computations)
        for f in ladders[n]
    }
    bound = max_iterations if max_iterations is not None else sum(len(lad) for lad in ladders) + 1
    iterations = 0
    reached = False
    while iterations < bound:
        path = critical_path(dag, [times[(n, clocks[n])] for n in range(dag.num_computations)])
        if all(n in envelope for n in path):
            reached = True
            break
        raisable = [n for n in path if clocks[n] < ladders[n][-1]]
        if not raisable:
            break
        iterations += 1
        lowest_mhz = min(clocks[n] for n in raisable)
        for n in raisable:
            if clocks[n] == lowest_mhz:
                clocks[n] = min(f for f in ladders[n] if f > clocks[n])
    return EnvPipeResult(evaluate_point(dag, profile, clocks, p_block_w), iterations, reached)


def envpipe(dag: ComputationDag, profile: Profile, p_block_w: float) -> list[CandidatePoint]:
    """EnvPipe's single plan, as a one-point list like the other baselines."""
    return [envpipe_run(dag, profile, p_block_w).point]

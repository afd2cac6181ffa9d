"""What the exact MILP reference (`exact`) solves for a case, whatever the deadline: its options and windows.

Per computation the options of one of two option spaces: `filtered` uses the Pareto-filtered options of
`build_option_set`, the same the Perseus solver chooses from (like for like); `all` uses every profile row (a
lower bound for any planner on this profile). Options dominated in (quant_time, effective cost) by another of
the same computation are dropped, and each computation's all-fastest time window (`head_quant`, `tail_quant`)
bounds its start; neither reduction changes the optimum. `exact` builds and solves the model for a deadline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from perseusd.errors import PlanningError
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.options import Option, build_option_set, quantise
from perseusd.planner.profile import Measurement, Profile

OptionSpace = Literal["filtered", "all"]


@dataclass(frozen=True)
class ExactProblem:
    """Everything about a case that does not depend on the deadline."""

    dag: ComputationDag
    unit_time_s: float
    p_block_w: float
    option_space: str
    all_options: tuple[tuple[Option, ...], ...]
    """Per node: every option of its option space (to map a start plan's clocks)."""
    candidates: tuple[tuple[Option, ...], ...]
    """Per node: the non-dominated options, fastest first."""
    head_quant: tuple[int, ...]
    """Per node: longest all-fastest path ending before the node starts."""
    tail_quant: tuple[int, ...]
    """Per node: longest all-fastest path from the node's start to the end (the node included)."""

    @property
    def t_min_quant(self) -> int:
        """The all-fastest iteration time."""
        return max((h + t for h, t in zip(self.head_quant, self.tail_quant, strict=True)), default=0)


def _raw_options(rows: Sequence[Measurement], unit_time_s: float, p_block_w: float) -> tuple[Option, ...]:
    options = []
    for m in rows:
        q = quantise(m.time_s, unit_time_s)
        options.append(Option(m.freq_mhz, m.time_s, m.energy_j, q, m.energy_j - p_block_w * q * unit_time_s))
    return tuple(options)


def _option_table(
    dag: ComputationDag, profile: Profile, unit_time_s: float, p_block_w: float, space: OptionSpace
) -> dict[tuple[int, Instruction], tuple[Option, ...]]:
    if space not in ("filtered", "all"):
        raise PlanningError(f"unknown option space '{space}' (expected filtered or all)")
    if not (p_block_w >= 0 and math.isfinite(p_block_w)):
        raise PlanningError(f"blocking power must be a finite non-negative number (got {p_block_w})")
    keys = sorted({(dag.virtual_stage(n), c.instruction) for n, c in enumerate(dag.computations)})
    table = {}
    for key in keys:
        rows = profile.options(*key)
        if space == "filtered":
            table[key] = build_option_set(key[0], key[1], rows, unit_time_s, p_block_w).options
        else:
            if not unit_time_s > 0:
                raise PlanningError(f"unit time must be positive (got {unit_time_s})")
            table[key] = _raw_options(rows, unit_time_s, p_block_w)
    return table


def non_dominated(options: Sequence[Option]) -> tuple[Option, ...]:
    """Options not dominated in (quant_time, effective cost), fastest first; ties keep the higher clock."""
    ordered = sorted(options, key=lambda o: (o.quant_time, o.effective_cost_j, -o.freq_mhz))
    kept: list[Option] = []
    for option in ordered:
        if not kept or option.effective_cost_j < kept[-1].effective_cost_j:
            kept.append(option)
    return tuple(kept)


def _windows(dag: ComputationDag, min_quant: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    head = [0] * dag.num_computations
    for node in dag.topological_order:
        head[node] = max((head[p] + min_quant[p] for p in dag.predecessors[node]), default=0)
    tail = [0] * dag.num_computations
    for node in reversed(dag.topological_order):
        tail[node] = min_quant[node] + max((tail[s] for s in dag.successors[node]), default=0)
    return tuple(head), tuple(tail)


def prepare_problem(
    dag: ComputationDag, profile: Profile, unit_time_s: float, p_block_w: float, space: OptionSpace
) -> ExactProblem:
    """The deadline-independent part of the exact model of a case, over the option space `space`."""
    table = _option_table(dag, profile, unit_time_s, p_block_w, space)
    keys = [(dag.virtual_stage(n), c.instruction) for n, c in enumerate(dag.computations)]
    pruned = {key: non_dominated(options) for key, options in table.items()}
    candidates = tuple(pruned[key] for key in keys)
    head, tail = _windows(dag, [c[0].quant_time for c in candidates])
    return ExactProblem(
        dag, unit_time_s, p_block_w, space, tuple(table[key] for key in keys), candidates, head, tail
    )


def longest_path_quant(dag: ComputationDag, durations_quant: Sequence[int]) -> int:
    """The DAG's longest path with integer durations per node id."""
    finish = [0] * dag.num_computations
    for node in dag.topological_order:
        finish[node] = durations_quant[node] + max((finish[p] for p in dag.predecessors[node]), default=0)
    return max(finish, default=0)


__all__ = [
    "ExactProblem",
    "OptionSpace",
    "longest_path_quant",
    "non_dominated",
    "prepare_problem",
]

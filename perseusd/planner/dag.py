"""Computation DAGs of pipeline-parallel training iterations.

A node is one computation (a forward or backward of one microbatch on one pipeline stage, and for
interleaved schedules one model chunk). Edges are the execution order on each stage plus the data
dependencies between consecutive model stages: F(v, j) -> F(v+1, j) and B(v+1, j) -> B(v, j). A schedule
that splits its backwards (zero bubble) has the input gradient in B's place, I(v+1, j) -> I(v, j), and the
weight gradient after its input gradient on the same stage, I(v, j) -> W(v, j), which nothing else waits
for. The model stage of chunk c on stage s is c * S + s, or in a V layout (`schedules.model_stage`)
2 S - 1 - s for chunk 1; a computation's profile stage (`virtual_stage`) is c * S + s either way. Every DAG
is built in O(N) from per-stage orders, so any schedule a framework runs can be planned with
`from_stage_orders`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from perseus_client.message import Instruction

from perseusd.errors import PlanningError
from perseusd.planner.schedule_orders import B, F, I, ScheduleStep, W
from perseusd.planner.schedules import Layout, instructions_of, layout_of, model_stage, spec_of

__all__ = [
    "B",
    "Computation",
    "ComputationDag",
    "F",
    "I",
    "Instruction",
    "ScheduleStep",
    "W",
    "build_dag",
    "from_stage_orders",
]


@dataclass(frozen=True, order=True)
class Computation:
    """One computation: `instruction` of `microbatch` on pipeline stage `stage` (model chunk `chunk`)."""

    stage: int
    instruction: Instruction
    microbatch: int
    chunk: int = 0

    def label(self) -> str:
        """A short human-readable name, e.g. `F3@s1` or `B0@s2c1`."""
        chunk = f"c{self.chunk}" if self.chunk else ""
        return f"{self.instruction.letter}{self.microbatch}@s{self.stage}{chunk}"


@dataclass(frozen=True)
class ComputationDag:
    """An immutable computation DAG with its per-stage schedule order.

    Node ids index `computations`. Nodes are numbered stage by stage, in execution order, so
    `stage_orders[s]` is a contiguous range of ids.
    """

    schedule: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    computations: tuple[Computation, ...]
    predecessors: tuple[tuple[int, ...], ...]
    successors: tuple[tuple[int, ...], ...]
    stage_orders: tuple[tuple[int, ...], ...]
    topological_order: tuple[int, ...]

    @property
    def num_computations(self) -> int:
        """Number of computation nodes (sources and sinks are implicit)."""
        return len(self.computations)

    @property
    def num_edges(self) -> int:
        """Number of dependency edges between computations."""
        return sum(len(s) for s in self.successors)

    def virtual_stage(self, node: int) -> int:
        """The virtual (model) stage of a node: the profile stage its time and energy come from."""
        comp = self.computations[node]
        return comp.chunk * self.num_stages + comp.stage

    def sources(self) -> tuple[int, ...]:
        """Nodes without predecessors (they follow the implicit source)."""
        return tuple(i for i, p in enumerate(self.predecessors) if not p)

    def sinks(self) -> tuple[int, ...]:
        """Nodes without successors (they precede the implicit sink)."""
        return tuple(i for i, s in enumerate(self.successors) if not s)

    def earliest_s(self, times_s: Sequence[float]) -> tuple[list[float], list[float]]:
        """(start, finish) of each computation (s, by node id) when each starts as soon as its predecessors
        have finished, node i taking `times_s[i]`."""
        start_s, finish_s = [0.0] * len(self.computations), [0.0] * len(self.computations)
        for node in self.topological_order:
            start_s[node] = max((finish_s[p] for p in self.predecessors[node]), default=0.0)
            finish_s[node] = start_s[node] + times_s[node]
        return start_s, finish_s


def build_dag(schedule: str, num_stages: int, num_microbatches: int, num_chunks: int = 1) -> ComputationDag:
    """Build the DAG of a named schedule (`perseusd.planner.schedules`: 1f1b, gpipe, interleaved, ...)."""
    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches, num_chunks=num_chunks)
    orders = spec_of(schedule).orders(num_stages, num_microbatches, num_chunks)
    return from_stage_orders(
        orders, num_microbatches=num_microbatches, num_chunks=num_chunks, schedule=schedule
    )


def from_stage_orders(
    orders: Sequence[Sequence[ScheduleStep]],
    num_microbatches: int,
    num_chunks: int = 1,
    schedule: str = "custom",
) -> ComputationDag:
    """Build a DAG from an explicit per-stage execution order, checking that it is complete and deadlock-free.

    Every stage must run each (instruction, microbatch, chunk) exactly once for all microbatches and chunks.
    """
    num_stages = len(orders)
    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches, num_chunks=num_chunks)
    instructions = instructions_of(any(step[0] in (I, W) for order in orders for step in order))
    computations: list[Computation] = []
    index: dict[Computation, int] = {}
    stage_orders: list[tuple[int, ...]] = []
    for stage, order in enumerate(orders):
        _check_stage_order(stage, order, num_microbatches, num_chunks, instructions)
        start = len(computations)
        for instruction, microbatch, chunk in order:
            comp = Computation(stage, Instruction(instruction), microbatch, chunk)
            index[comp] = len(computations)
            computations.append(comp)
        stage_orders.append(tuple(range(start, len(computations))))
    preds, succs = _edges(computations, index, stage_orders, layout_of(schedule))
    topo = _topological_order(preds, succs, computations)
    return ComputationDag(
        schedule=schedule,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        num_chunks=num_chunks,
        computations=tuple(computations),
        predecessors=tuple(tuple(p) for p in preds),
        successors=tuple(tuple(s) for s in succs),
        stage_orders=tuple(stage_orders),
        topological_order=topo,
    )


def _edges(
    computations: list[Computation],
    index: dict[Computation, int],
    stage_orders: list[tuple[int, ...]],
    layout: Layout,
) -> tuple[list[list[int]], list[list[int]]]:
    """Predecessors and successors: each stage's order, the data between model stages, I before its W."""
    preds: list[list[int]] = [[] for _ in computations]
    succs: list[list[int]] = [[] for _ in computations]

    def add_edge(u: int, v: int) -> None:
        if v not in succs[u]:
            succs[u].append(v)
            preds[v].append(u)

    for ids in stage_orders:
        for u, v in itertools.pairwise(ids):
            add_edge(u, v)
    num_stages = len(stage_orders)
    placed = {model_stage(layout, num_stages, c.stage, c.chunk): (c.stage, c.chunk) for c in computations}
    for node, comp in enumerate(computations):
        if comp.instruction is W:
            add_edge(index[Computation(comp.stage, I, comp.microbatch, comp.chunk)], node)
            continue
        step = 1 if comp.instruction is F else -1
        nxt = placed.get(model_stage(layout, num_stages, comp.stage, comp.chunk) + step)
        if nxt is not None:
            add_edge(node, index[Computation(nxt[0], comp.instruction, comp.microbatch, nxt[1])])
    return preds, succs


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise PlanningError(f"{name.replace('_', ' ')} must be at least 1 (got {value})")


def _check_stage_order(
    stage: int,
    order: Sequence[ScheduleStep],
    num_microbatches: int,
    num_chunks: int,
    instructions: tuple[Instruction, ...],
) -> None:
    expected = {(i, j, c) for i in instructions for j in range(num_microbatches) for c in range(num_chunks)}
    seen: set[ScheduleStep] = set()
    for step in order:
        key = (Instruction(step[0]), step[1], step[2])
        if key[0] is W and (I, key[1], key[2]) not in seen:
            raise PlanningError(
                f"stage {stage}: the weight gradient of microbatch {key[1]} chunk {key[2]} runs before its "
                "input gradient"
            )
        if key not in expected:
            raise PlanningError(
                f"stage {stage}: {key[0].value} of microbatch {key[1]} chunk {key[2]} is out of range"
            )
        if key in seen:
            raise PlanningError(
                f"stage {stage}: {key[0].value} of microbatch {key[1]} chunk {key[2]} runs twice"
            )
        seen.add(key)
    missing = sorted(expected - seen)
    if missing:
        instruction, microbatch, chunk = missing[0]
        raise PlanningError(
            f"stage {stage}: {len(missing)} computations never run, "
            f"e.g. {instruction.value} of microbatch {microbatch} chunk {chunk}"
        )


def _topological_order(
    preds: list[list[int]], succs: list[list[int]], computations: list[Computation]
) -> tuple[int, ...]:
    indegree = [len(p) for p in preds]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        node = ready.pop()
        order.append(node)
        for nxt in succs[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(computations):
        stuck = next(computations[i] for i, d in enumerate(indegree) if d > 0)
        raise PlanningError(f"the schedule deadlocks: {stuck.label()} waits on a cycle of dependencies")
    return tuple(order)

"""Computation DAGs: the specified 1F1B order and edges, other schedules, explicit orders and their errors."""

from __future__ import annotations

import pytest

from perseusd.errors import PlanningError
from perseusd.planner.dag import B, F, build_dag, from_stage_orders
from perseusd.planner.schedule_orders import one_f_one_b_order


def labels(schedule: str, stages: int, microbatches: int, stage: int, chunks: int = 1) -> list[str]:
    dag = build_dag(schedule, stages, microbatches, chunks)
    return [dag.computations[i].label() for i in dag.stage_orders[stage]]


def test_one_f_one_b_matches_the_specification_example() -> None:
    assert (
        " ".join(labels("1f1b", 4, 6, 0))
        == "F0@s0 F1@s0 F2@s0 F3@s0 B0@s0 F4@s0 B1@s0 F5@s0 B2@s0 B3@s0 B4@s0 B5@s0"
    )
    assert " ".join(x.split("@")[0] for x in labels("1f1b", 4, 6, 3)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


def test_one_f_one_b_edges() -> None:
    stages, microbatches = 4, 6
    dag = build_dag("1f1b", stages, microbatches)
    index = {c: i for i, c in enumerate(dag.computations)}
    # stage chains + forward chain + backward chain
    expected = stages * (2 * microbatches - 1) + 2 * (stages - 1) * microbatches
    assert dag.num_edges == expected
    f = {(c.stage, c.microbatch): i for c, i in index.items() if c.instruction is F}
    b = {(c.stage, c.microbatch): i for c, i in index.items() if c.instruction is B}
    assert f[(1, 2)] in dag.successors[f[(0, 2)]]
    assert b[(0, 2)] in dag.successors[b[(1, 2)]]
    assert dag.sources() == (f[(0, 0)],)
    assert dag.sinks() == (b[(0, microbatches - 1)],)


def test_warmup_is_capped_by_microbatches() -> None:
    assert one_f_one_b_order(8, 2, 0) == [(F, 0, 0), (F, 1, 0), (B, 0, 0), (B, 1, 0)]


def test_gpipe_runs_every_forward_first() -> None:
    assert [x.split("@")[0] for x in labels("gpipe", 2, 3, 1)] == ["F0", "F1", "F2", "B0", "B1", "B2"]


@pytest.mark.parametrize(("stages", "microbatches", "chunks"), [(2, 4, 2), (4, 8, 2), (4, 4, 3), (8, 16, 4)])
def test_interleaved_is_complete_and_deadlock_free(stages: int, microbatches: int, chunks: int) -> None:
    dag = build_dag("interleaved", stages, microbatches, chunks)
    assert dag.num_computations == 2 * stages * microbatches * chunks
    assert len(dag.topological_order) == dag.num_computations
    first = dag.computations[dag.sources()[0]]
    assert (first.stage, first.chunk, first.instruction) == (0, 0, F)
    last = dag.computations[dag.sinks()[0]]
    assert (last.stage, last.chunk, last.instruction) == (0, 0, B)
    # virtual stage v = chunk * S + stage: chunk 1 of stage 0 follows chunk 0 of the last stage
    vstages = {dag.virtual_stage(i) for i in range(dag.num_computations)}
    assert vstages == set(range(stages * chunks))


def test_interleaved_needs_whole_groups_of_microbatches() -> None:
    with pytest.raises(PlanningError, match="multiple of stages"):
        build_dag("interleaved", 4, 6, 2)


def test_explicit_order_reproduces_a_named_schedule() -> None:
    named = build_dag("1f1b", 3, 4)
    orders = [
        [(c.instruction, c.microbatch, c.chunk) for c in (named.computations[i] for i in ids)]
        for ids in named.stage_orders
    ]
    explicit = from_stage_orders(orders, num_microbatches=4)
    assert explicit.successors == named.successors
    assert explicit.schedule == "custom"


def test_explicit_order_that_deadlocks_is_refused() -> None:
    # stage 0 runs its backward before the forward that stage 1 needs first
    orders = [[(B, 0, 0), (F, 0, 0)], [(F, 0, 0), (B, 0, 0)]]
    with pytest.raises(PlanningError, match="deadlocks"):
        from_stage_orders(orders, num_microbatches=1)


@pytest.mark.parametrize(
    ("orders", "message"),
    [
        ([[(F, 0, 0), (B, 0, 0), (F, 0, 0)]], "runs twice"),
        ([[(F, 0, 0)]], "never run"),
        ([[(F, 0, 0), (B, 0, 0), (F, 5, 0)]], "out of range"),
    ],
)
def test_explicit_order_errors_are_clear(orders: list[list[tuple[object, int, int]]], message: str) -> None:
    with pytest.raises(PlanningError, match=message):
        from_stage_orders(orders, num_microbatches=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schedule", "kwargs", "message"),
    [("zigzag", {}, "unknown schedule"), ("1f1b", {"num_chunks": 2}, "one chunk")],
)
def test_bad_schedule_arguments(schedule: str, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(PlanningError, match=message):
        build_dag(schedule, 2, 2, **kwargs)


def test_zero_stages_is_an_error() -> None:
    with pytest.raises(PlanningError, match="at least 1"):
        build_dag("1f1b", 0, 4)

"""The schedule registry: one entry per named schedule, the protocol's names and the rules each shape must
meet."""

from __future__ import annotations

from typing import get_args

import pytest
from perseus_client.message import Schedule

from perseusd.errors import PlanningError
from perseusd.planner.dag import build_dag
from perseusd.planner.schedules import NAMES, OBSERVED, WIRE_NAMES, spec_of


def test_the_registry_holds_every_schedule_the_protocol_names() -> None:
    assert set(NAMES) | {OBSERVED} == set(get_args(Schedule)) == set(WIRE_NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_named_schedule_builds_a_complete_deadlock_free_dag(name: str) -> None:
    spec = spec_of(name)
    built = 0
    for stages in range(1, 6):
        for microbatches in range(1, 11):
            for chunks in range(1, 4):
                if spec.problem(stages, microbatches, chunks) is not None:
                    with pytest.raises(PlanningError):
                        build_dag(name, stages, microbatches, chunks)
                    continue
                dag = build_dag(name, stages, microbatches, chunks)
                per_microbatch = 2 * chunks * stages
                assert dag.num_computations == per_microbatch * microbatches
                assert len(dag.topological_order) == dag.num_computations
                built += 1
    assert built > 20


@pytest.mark.parametrize(
    ("name", "stages", "microbatches", "chunks", "problem"),
    [
        ("1f1b", 4, 8, 2, "1F1B runs one chunk per stage"),
        ("gpipe", 4, 8, 2, "GPipe runs one chunk per stage"),
        ("interleaved", 4, 6, 2, "multiple of stages"),
    ],
)
def test_a_shape_a_schedule_cannot_run_is_refused_with_its_rule(
    name: str, stages: int, microbatches: int, chunks: int, problem: str
) -> None:
    with pytest.raises(PlanningError, match=problem):
        build_dag(name, stages, microbatches, chunks)
    assert problem in (spec_of(name).problem(stages, microbatches, chunks) or "")


def test_an_unknown_schedule_names_the_known_ones() -> None:
    with pytest.raises(PlanningError, match="expected 1f1b, gpipe, interleaved"):
        build_dag("zigzag", 2, 2)

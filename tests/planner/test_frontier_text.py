"""The fast frontier JSON writer gives exactly `json.dumps`'s bytes, whatever the document holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import build_dag
from perseusd.planner.frontier_text import frontier_json
from perseusd.planner.plan import PlanMeta, frontier_document, load_frontier, save_json_text
from perseusd.planner.solver import FrontierSolver, SolverParams


def solved_document() -> dict[str, Any]:
    dag, profile = build_dag("1f1b", 4, 6), bundled_profile("a100_sxm")
    points = list(FrontierSolver(dag, profile, SolverParams(0.001, 83.64)).points())
    assert len(points) > 100
    return frontier_document(dag, points, PlanMeta.for_dag(dag, profile, 0.001, 83.64))


def test_same_bytes_as_json_dumps_on_a_solved_frontier(tmp_path: Path) -> None:
    doc = solved_document()
    text = frontier_json(doc)
    assert text == json.dumps(doc, allow_nan=False)
    save_json_text(text, tmp_path / "frontier.json", durable=False)
    assert len(load_frontier(tmp_path / "frontier.json").points) == len(doc["points"])


@pytest.mark.parametrize(
    "doc",
    [
        {"points": []},
        {"meta": {"profile_source": "a\x00clocks\x00b"}, "points": [{"clocks_mhz": [[1, 2]]}]},
        {"points": [{"clocks_mhz": [[True, 2], [1.5], []], "x": "\x00clocks\x00"}, {"clocks_mhz": []}]},
        {
            "points": [
                {"clocks_mhz": [[1], [1]]},
                {"clocks_mhz": [[1], [2], [3]]},
                {"clocks_mhz": [(1,), [2]]},
            ]
        },
        {"points": [{"clocks_mhz": "not rows"}]},
        {"points": "not a list"},
        {"other": 1},
    ],
)
def test_same_bytes_as_json_dumps_on_odd_documents(doc: dict[str, Any]) -> None:
    assert frontier_json(doc) == json.dumps(doc, allow_nan=False)


def test_not_a_number_is_refused_as_json_dumps_does() -> None:
    for doc in (
        {"points": [{"clocks_mhz": [[float("nan")]]}]},
        {"points": [{"time_s": float("inf"), "clocks_mhz": []}]},
    ):
        with pytest.raises(ValueError, match="Out of range float"):
            frontier_json(doc)


def test_equal_rows_of_other_types_are_not_reused() -> None:
    doc = {"points": [{"clocks_mhz": [[1, 2]]}, {"clocks_mhz": [[True, 2]]}, {"clocks_mhz": [[1.0, 2]]}]}
    assert frontier_json(doc) == json.dumps(doc)

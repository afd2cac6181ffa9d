"""The fast frontier JSON writers give exactly `json.dumps`'s bytes, whatever the document holds: with the C
extension `_jsontext` and with the pure-Python code that runs where it was not built."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perseusd.errors import PlanningError
from perseusd.planner import frontier_text
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import build_dag
from perseusd.planner.frontier_text import frontier_json
from perseusd.planner.plan import PlanMeta, frontier_document, frontier_json_text, save_json_text
from perseusd.planner.plan_read import load_frontier
from perseusd.planner.solver import FrontierPoint, FrontierSolver, SolverParams

DAG, PROFILE = build_dag("1f1b", 4, 6), bundled_profile("a100_sxm")
META = PlanMeta.for_dag(DAG, PROFILE, 0.001, 83.64)


@pytest.fixture(params=["c", "python"], autouse=True)
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the C extension and with the pure-Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(frontier_text, "_C", None)
    elif frontier_text._C is None:
        pytest.fail("the C JSON writer was not built: scripts/setup.sh builds it")
    return str(request.param)


def solved_points() -> list[FrontierPoint]:
    points = list(FrontierSolver(DAG, PROFILE, SolverParams(0.001, 83.64)).points())
    assert len(points) > 100
    return points


def solved_document() -> dict[str, Any]:
    return frontier_document(DAG, solved_points(), META)


def test_points_straight_to_text_give_the_documents_bytes(tmp_path: Path) -> None:
    points = solved_points()
    text = frontier_json_text(DAG, points, META)
    assert text == json.dumps(frontier_document(DAG, points, META), allow_nan=False)
    save_json_text(text, tmp_path / "frontier.json", durable=False)
    assert [p.clocks_mhz for p in load_frontier(tmp_path / "frontier.json").points] == [
        tuple(tuple(p.clocks_mhz[i] for i in ids) for ids in DAG.stage_orders) for p in points
    ]
    assert frontier_json_text(DAG, [], META) == json.dumps(frontier_document(DAG, [], META))


def test_points_of_other_types_are_written_as_json_dumps_writes_them() -> None:
    point = solved_points()[3]
    clocks = list(point.clocks_mhz)
    odd = [
        replace(point, clocks_mhz=(True, *clocks[1:])),
        replace(point, clocks_mhz=tuple(float(c) for c in clocks)),
        replace(point, clocks_mhz=(2**70, *clocks[1:])),
        replace(point, clocks_mhz=(-5, *clocks[1:])),
        replace(point, time_s=3, model_energy_j=1e300, refined_energy_j=-0.0),
        replace(point, clocks_mhz=clocks),  # type: ignore[arg-type]
    ]
    for points in ([point, *odd], *([p, p] for p in odd)):
        expected = json.dumps(frontier_document(DAG, points, META), allow_nan=False)
        assert frontier_json_text(DAG, points, META) == expected


def test_bad_points_are_refused_as_the_document_refuses_them() -> None:
    point = solved_points()[0]
    with pytest.raises(ValueError, match="Out of range float"):
        frontier_json_text(DAG, [point, replace(point, refined_energy_j=float("nan"))], META)
    for clocks in (point.clocks_mhz[:-1], (*point.clocks_mhz, 1)):
        with pytest.raises(PlanningError, match="clocks for a DAG of"):
            frontier_json_text(DAG, [point, replace(point, clocks_mhz=clocks)], META)


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
    doc = {"points": [{"clocks_mhz": [[1.0, 2]]}, {"clocks_mhz": [[1, 2]]}, {"clocks_mhz": [[1, 2]]}]}
    assert frontier_json(doc) == json.dumps(doc)
    doc = {"points": [{"clocks_mhz": [[-3, 2**63 - 1]]}, {"clocks_mhz": [[2**64, 0]]}, {"clocks_mhz": [[]]}]}
    assert frontier_json(doc) == json.dumps(doc)

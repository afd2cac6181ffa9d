"""The `perseus-frontier` document: every point after the first writes only the clocks that changed from the
point before (version 2), where version 1 repeated every clock of every point (32 MB at 8 x 96); version 1
documents (job caches, frontiers users saved) still load, as the same frontier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perseusd.errors import PlanFormatError
from perseusd.planner import plan_read
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import build_dag
from perseusd.planner.plan import PlanMeta, frontier_document, frontier_from_points, save_json
from perseusd.planner.plan_read import load_frontier, parse_frontier
from perseusd.planner.solver import FrontierPoint, FrontierSolver, SolverParams

DAG, PROFILE = build_dag("1f1b", 4, 6), bundled_profile("a100_sxm")
META = PlanMeta.for_dag(DAG, PROFILE, 0.001, 83.64)


def solved_points() -> list[FrontierPoint]:
    points = list(FrontierSolver(DAG, PROFILE, SolverParams(0.001, 83.64)).points())
    assert len(points) > 100
    return points


def version_1(points: list[FrontierPoint]) -> dict[str, Any]:
    """The document as Perseus wrote it before version 2: every point with every stage's clocks."""
    doc = frontier_document(DAG, [], META) | {"version": 1}
    doc["points"] = [
        {
            "index": i,
            "quant_time": p.quant_time,
            "time_s": p.time_s,
            "model_energy_j": p.model_energy_j,
            "refined_energy_j": p.refined_energy_j,
            "clocks_mhz": [[p.clocks_mhz[node] for node in ids] for ids in DAG.stage_orders],
        }
        for i, p in enumerate(points)
    ]
    return doc


def test_later_points_write_only_the_clocks_that_changed(tmp_path: Path) -> None:
    points = solved_points()
    doc = frontier_document(DAG, points, META)
    assert doc["version"] == 2
    first, *later = doc["points"]
    assert "clocks_mhz" in first
    assert all("clocks_mhz" not in p and "clock_changes" in p for p in later)
    changes = sum(len(p["clock_changes"]) for p in later)
    assert changes < len(later) * DAG.num_computations / 5
    assert len(json.dumps(doc)) < len(json.dumps(version_1(points))) / 2
    save_json(doc, tmp_path / "frontier.json", durable=False)
    loaded = load_frontier(tmp_path / "frontier.json")
    assert [p.node_clocks_mhz() for p in loaded.points] == [p.clocks_mhz for p in points]
    assert loaded == frontier_from_points(DAG, points, META)


def test_a_version_1_document_loads_as_the_same_frontier() -> None:
    points = solved_points()
    old = parse_frontier(json.dumps(version_1(points)), "version 1")
    assert old == parse_frontier(json.dumps(frontier_document(DAG, points, META)), "version 2")
    assert all(
        a is b for a, b in zip(old.points[1].clocks_mhz, old.points[2].clocks_mhz, strict=True) if a == b
    )


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ([[4, 0, 1410]], "changes stage 4 position 0, which the schedule does not have"),
        ([[0, 12, 1410]], "changes stage 0 position 12, which the schedule does not have"),
        ([[0, 0]], "must be [stage, position, clock_mhz]"),
        ([[0, 0, 0]], "clock_changes[0][2]"),
        ([[0, True, 1410]], "clock_changes[0][1]"),
        ([[-1, 0, 1410]], "clock_changes[0][0]"),
        ("all", "clock_changes"),
    ],
)
def test_bad_clock_changes_are_refused(changes: object, fragment: str) -> None:
    doc = frontier_document(DAG, solved_points()[:3], META)
    doc["points"][1]["clock_changes"] = changes
    with pytest.raises(PlanFormatError) as info:
        parse_frontier(json.dumps(doc), "f.json")
    assert str(info.value).startswith("f.json: points[1].clock_changes")
    assert fragment in str(info.value)


def test_the_first_point_writes_every_clock() -> None:
    doc = frontier_document(DAG, solved_points()[:2], META)
    doc["points"][0]["clock_changes"] = doc["points"][0].pop("clocks_mhz")
    with pytest.raises(PlanFormatError, match=r"points\[0\].*clocks_mhz"):
        parse_frontier(json.dumps(doc), "f.json")


def test_a_newer_version_is_refused_naming_those_read() -> None:
    doc = frontier_document(DAG, solved_points()[:2], META) | {"version": 3}
    with pytest.raises(PlanFormatError, match=r"3 is not supported \(this Perseus reads version 1 or 2\)"):
        parse_frontier(json.dumps(doc), "f.json")


def test_well_formed_clocks_read_at_once_give_what_the_strict_walk_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Well-formed clock fields skip the field-by-field walk (a 4 x 16 job's 4,000-point frontier read in
    half the time); the frontier is the same, and a malformed field still gets the walk's error."""
    text = json.dumps(frontier_document(DAG, solved_points(), META))
    fast = parse_frontier(text, "f.json")
    monkeypatch.setattr(plan_read, "_whole_rows", lambda *_args: None)
    monkeypatch.setattr(plan_read, "_changed_rows", lambda *_args: None)
    assert parse_frontier(text, "f.json") == fast


@pytest.mark.parametrize("bad", [True, 0, 1.5, "1410", None])
def test_a_clock_that_is_not_an_integer_of_at_least_1_mhz_is_named(bad: object) -> None:
    doc = frontier_document(DAG, solved_points()[:3], META)
    doc["points"][0]["clocks_mhz"][1][2] = bad
    with pytest.raises(PlanFormatError, match=r"^f\.json: points\[0\]\.clocks_mhz\[1\]\[2\] must be"):
        parse_frontier(json.dumps(doc), "f.json")

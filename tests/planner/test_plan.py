"""Plan and frontier JSON documents: round trips and strict loading."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perseusd.errors import PlanFormatError, PlanningError
from perseusd.planner.dag import ComputationDag, Instruction, build_dag
from perseusd.planner.plan import (
    PlanMeta,
    frontier_document,
    frontier_from_points,
    frontier_to_document,
    plan_document,
    plan_from_frontier,
    plan_from_point,
    save_json,
)
from perseusd.planner.plan_read import load_frontier, load_plan, parse_frontier
from perseusd.planner.schedule_orders import one_f_one_b_order
from tests.planner.periphery_profiles import CLOCKS_MHZ, shaped_profile
from tests.support.synthetic import Point

PROFILE = shaped_profile([1.0, 1.2, 0.9, 1.1])


def point_for(dag: ComputationDag, shift: int = 0) -> Point:
    clocks = tuple(CLOCKS_MHZ[(n + shift) % len(CLOCKS_MHZ)] for n in range(dag.num_computations))
    return Point(300 + shift, (300 + shift) * 0.001, 1234.5 + shift, 1234.25 + shift, clocks)


def saved_plan(tmp_path: Path, dag: ComputationDag) -> tuple[Path, dict[str, Any]]:
    meta = PlanMeta.for_dag(dag, PROFILE, 0.001, 60.0)
    doc = plan_from_point(dag, point_for(dag), meta)
    path = tmp_path / "plan.json"
    save_json(doc, path, indent=2)
    return path, doc


@pytest.mark.parametrize(
    ("schedule", "stages", "chunks"), [("1f1b", 4, 1), ("gpipe", 3, 1), ("interleaved", 2, 2)]
)
def test_plan_round_trip(tmp_path: Path, schedule: str, stages: int, chunks: int) -> None:
    dag = build_dag(schedule, stages, 4, chunks)
    path, _ = saved_plan(tmp_path, dag)
    plan = load_plan(path)
    point = point_for(dag)
    assert plan.node_clocks_mhz() == point.clocks_mhz
    assert (plan.quant_time, plan.time_s) == (point.quant_time, point.time_s)
    assert (plan.model_energy_j, plan.refined_energy_j) == (point.model_energy_j, point.refined_energy_j)
    assert plan.meta == PlanMeta(PROFILE.digest(), "shaped", schedule, stages, 4, chunks, 0.001, 60.0)
    assert plan.dag().stage_orders == dag.stage_orders
    plan.check_profile(PROFILE)


def test_plan_lists_clocks_per_stage_in_schedule_order(tmp_path: Path) -> None:
    dag = build_dag("1f1b", 4, 6)
    _, doc = saved_plan(tmp_path, dag)
    assert doc["format"] == "perseus-plan"
    assert doc["version"] == 1
    stage0 = doc["stages"][0]
    expected = [(i.value, j) for i, j, _ in one_f_one_b_order(4, 6, 0)]
    assert [(e["instruction"], e["microbatch"]) for e in stage0] == expected
    assert stage0[0] == {"instruction": "forward", "microbatch": 0, "chunk": 0, "freq_mhz": CLOCKS_MHZ[0]}


def test_frontier_round_trip(tmp_path: Path) -> None:
    dag = build_dag("1f1b", 4, 5)
    points = [point_for(dag, shift) for shift in range(3)]
    path = tmp_path / "frontier.json"
    save_json(frontier_document(dag, points, PlanMeta.for_dag(dag, PROFILE, 0.001, 0.0)), path)
    frontier = load_frontier(path)
    assert [p.index for p in frontier.points] == [0, 1, 2]
    assert [p.node_clocks_mhz() for p in frontier.points] == [p.clocks_mhz for p in points]
    assert plan_from_frontier(frontier, 2).model_energy_j == points[2].model_energy_j
    with pytest.raises(PlanFormatError, match="no point with index 7"):
        plan_from_frontier(frontier, 7)


def test_a_frontier_point_and_the_daemons_plan_document_are_one_plan(tmp_path: Path) -> None:
    """The daemon's plan of a deployed point (from its typed frontier, fresh or read back from its document)
    is the document the planner writes for that point, plus the point's index: one writer, and it loads as
    the same plan."""
    dag = build_dag("1f1b", 4, 5)
    points = [point_for(dag, shift) for shift in range(3)]
    meta = PlanMeta.for_dag(dag, PROFILE, 0.001, 0.0)
    solved = frontier_from_points(dag, points, meta)
    loaded = parse_frontier(json.dumps(frontier_to_document(solved)), "frontier")  # as the cache keeps it
    assert loaded == solved
    for frontier in (solved, loaded):
        for index, point in enumerate(points):
            daemon_doc = plan_document(plan_from_frontier(frontier, index))
            assert daemon_doc.pop("index") == index
            assert json.dumps(daemon_doc) == json.dumps(plan_from_point(dag, point, meta))
            save_json(daemon_doc, tmp_path / "plan.json")
            assert load_plan(tmp_path / "plan.json").node_clocks_mhz() == point.clocks_mhz


def test_equal_stage_rows_of_consecutive_points_are_one_object() -> None:
    """A frontier keeps (and pickles) a row of clocks once while consecutive points leave it as it is."""
    dag = build_dag("1f1b", 4, 5)
    first = point_for(dag, 0)
    clocks = list(first.clocks_mhz)
    clocks[dag.stage_orders[2][0]] = 1005  # the next point changes one clock of stage 2
    second = Point(1, 0.002, 1.0, 1.0, tuple(clocks))
    frontier = frontier_from_points(dag, [first, second], PlanMeta.for_dag(dag, PROFILE, 0.001, 0.0))
    a, b = (p.clocks_mhz for p in frontier.points)
    assert [x is y for x, y in zip(a, b, strict=True)] == [True, True, False, True]
    assert b[2][0] == 1005
    restored = pickle.loads(pickle.dumps(frontier))
    assert restored == frontier
    assert restored.points[0].clocks_mhz[0] is restored.points[1].clocks_mhz[0]


def test_wrong_clock_count_is_refused_when_writing() -> None:
    dag = build_dag("1f1b", 2, 2)
    short = Point(1, 0.001, 1.0, 1.0, (1410,) * (dag.num_computations - 1))
    with pytest.raises(PlanningError, match="7 clocks for a DAG of 8"):
        plan_from_point(dag, short, PlanMeta.for_dag(dag, PROFILE, 0.001, 0.0))


def test_profile_digest_mismatch(tmp_path: Path) -> None:
    path, _ = saved_plan(tmp_path, build_dag("1f1b", 4, 4))
    with pytest.raises(PlanFormatError, match="solve again"):
        load_plan(path).check_profile(shaped_profile([1.0, 1.2, 0.9, 1.3]))


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        target = doc
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        target[last] = value

    return edit


def _delete(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        target = doc
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        del target[last]

    return edit


def _drop_last_clock(doc: dict[str, Any]) -> None:
    doc["stages"][1].pop()


def _swap_first_two(doc: dict[str, Any]) -> None:
    stage = doc["stages"][0]
    stage[0], stage[1] = stage[1], stage[0]


def _drop_stage(doc: dict[str, Any]) -> None:
    doc["stages"].pop()


def _string_clock(doc: dict[str, Any]) -> None:
    doc["stages"][0][0]["freq_mhz"] = "1410"


def _bool_microbatch(doc: dict[str, Any]) -> None:
    doc["stages"][0][0]["microbatch"] = False


def _bad_instruction(doc: dict[str, Any]) -> None:
    doc["stages"][0][0]["instruction"] = "fwd"


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (_set("format", "perseus-frontier"), "format is 'perseus-frontier', expected 'perseus-plan'"),
        (_set("version", 2), "version 2 is not supported"),
        (_set("version", "1"), "version must be an integer"),
        (_delete("meta"), "meta is missing"),
        (_delete("meta.profile_digest"), "meta.profile_digest is missing"),
        (_set("meta.num_stages", 4.0), "meta.num_stages must be an integer"),
        (_set("meta.unit_time_s", "1ms"), "meta.unit_time_s must be a number"),
        (_set("time_s", None), "time_s must be a number, not null"),
        (_delete("refined_energy_j"), "refined_energy_j is missing"),
        (_set("stages", {}), "stages must be a list"),
        (_drop_last_clock, "stage 1 has 7 clocks, its schedule has 8"),
        (_drop_stage, "3 stages of clocks, meta.num_stages is 4"),
        (_swap_first_two, "stage 0 entry 0 is forward of microbatch 1 chunk 0"),
        (_string_clock, "stages[0][0].freq_mhz must be an integer, not a string"),
        (_bool_microbatch, "stages[0][0].microbatch must be an integer, not a boolean"),
        (_bad_instruction, "'fwd' is not an instruction"),
    ],
)
def test_malformed_plans_are_refused(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], fragment: str
) -> None:
    path, doc = saved_plan(tmp_path, build_dag("1f1b", 4, 4))
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFormatError) as info:
        load_plan(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_frontier_with_a_short_clock_list_is_refused(tmp_path: Path) -> None:
    dag = build_dag("1f1b", 4, 4)
    doc = frontier_document(dag, [point_for(dag)], PlanMeta.for_dag(dag, PROFILE, 0.001, 0.0))
    doc["points"][0]["clocks_mhz"][2].pop()
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        PlanFormatError, match=r"points\[0\]\.clocks_mhz\[2\] has 7 clocks, but stage 2 runs 8"
    ):
        load_frontier(path)


def test_a_plan_is_not_a_frontier(tmp_path: Path) -> None:
    path, _ = saved_plan(tmp_path, build_dag("1f1b", 4, 4))
    with pytest.raises(PlanFormatError, match="expected 'perseus-frontier'"):
        load_frontier(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (None, "cannot read"),  # no file at all
        ("{not json", "not valid JSON"),
        ('{"format": NaN}', "NaN is not allowed"),
        ("[1, 2]", "the document must be an object"),
        ("__import__('os').system('false')", "not valid JSON"),
    ],
)
def test_unreadable_documents(tmp_path: Path, text: str | None, fragment: str) -> None:
    path = tmp_path / "bad.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(PlanFormatError, match=fragment):
        load_plan(path)


def test_save_json_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    save_json({"a": 1}, path)
    with pytest.raises(ValueError, match="Out of range float"):
        save_json({"a": float("nan")}, path)
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_order_entries_name_instructions() -> None:
    dag = build_dag("1f1b", 2, 2)
    doc = frontier_document(dag, [], PlanMeta.for_dag(dag, PROFILE, 0.001, 0.0))
    assert doc["order"][1] == [["forward", 0, 0], ["backward", 0, 0], ["forward", 1, 0], ["backward", 1, 0]]
    assert doc["points"] == []
    assert Instruction.FORWARD.value == "forward"

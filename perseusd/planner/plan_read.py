"""Loading plan and frontier documents (`plan.py` writes them), strictly: data, never code.

Anything malformed is a `PlanFormatError` naming the file and the field. JSON is parsed with `json`,
nothing is ever evaluated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from perseusd.errors import PlanFormatError, PlanningError
from perseusd.planner.dag import Instruction, ScheduleStep, build_dag, from_stage_orders
from perseusd.planner.plan import (
    FRONTIER_FORMAT,
    FRONTIER_VERSIONS_READ,
    PLAN_FORMAT,
    PLAN_VERSION,
    Followed,
    Frontier,
    Plan,
    PlanMeta,
    Rows,
    RowSharer,
    SwitchingMeta,
)
from perseusd.planner.plan_schema import Reader
from perseusd.planner.schedules import SCHEDULES


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Load and check a `perseus-plan` document; raises `PlanFormatError` when anything is wrong."""
    return _plan_document(Reader(os.fspath(path), _read_json(path)))


def parse_plan(text: str, source: str) -> Plan:
    """`load_plan` for a document received as text (`source` names it in errors)."""
    return _plan_document(Reader(source, _parse_json(text, source)))


def _plan_document(doc: Reader) -> Plan:
    meta = _read_header(doc, PLAN_FORMAT, (PLAN_VERSION,))
    order: list[tuple[ScheduleStep, ...]] = []
    clocks: list[tuple[int, ...]] = []
    for stage in doc.items("stages"):
        steps = [_entry(entry) for entry in stage.items_of()]
        order.append(tuple(step for step, _ in steps))
        clocks.append(tuple(clock for _, clock in steps))
    _check_order(doc.source, meta, order)
    return _plan(doc, meta, None, tuple(order), tuple(clocks), None)


def load_frontier(path: str | os.PathLike[str]) -> Frontier:
    """Load and check a `perseus-frontier` document; raises `PlanFormatError` when anything is wrong."""
    return _frontier_document(Reader(os.fspath(path), _read_json(path)))


def parse_frontier(text: str, source: str) -> Frontier:
    """`load_frontier` for a document received as text (`source` names it in errors)."""
    return _frontier_document(Reader(source, _parse_json(text, source)))


def _frontier_document(doc: Reader) -> Frontier:
    meta = _read_header(doc, FRONTIER_FORMAT, FRONTIER_VERSIONS_READ)
    order = tuple(tuple(_triple(step) for step in stage.items_of()) for stage in doc.items("order"))
    _check_order(doc.source, meta, order)
    points = []
    clocks: Rows | None = None
    rows = RowSharer()  # equal rows of consecutive points as one object (version 1 repeats them)
    for point in doc.items("points"):
        clocks = rows.share(_point_clocks(point, order, "", clocks))
        points.append(
            _plan(
                point, meta, point.get_int("index", minimum=0), order, clocks, _followed(point, order, clocks)
            )
        )
    switching = _switching(doc.child("switching")) if "switching" in doc.as_dict() else None
    return Frontier(meta, order, tuple(points), switching)


def _switching(doc: Reader) -> SwitchingMeta:
    return SwitchingMeta(
        doc.get_float("latency_s", minimum=0.0),
        doc.get_float("lead_s", minimum=0.0),
        doc.get_float("min_run_s", minimum=0.0),
    )


def _followed(point: Reader, order: tuple[tuple[ScheduleStep, ...], ...], clocks: Rows) -> Followed | None:
    """A point's switch-aware fields, when it has them (all of them, else `PlanFormatError`)."""
    fields = point.as_dict()
    if "effective_clocks_mhz" not in fields and "effective_clock_changes" not in fields:
        return None
    solved_given = "solved_clocks_mhz" in fields or "solved_clock_changes" in fields
    return Followed(
        planned_time_s=point.get_float("planned_time_s", minimum=0.0),
        planned_energy_j=point.get_float("planned_energy_j"),
        effective_clocks_mhz=_point_clocks(point, order, "effective_", clocks),
        switch_changed=point.get_int("switch_changed", minimum=0),
        solved_clocks_mhz=_point_clocks(point, order, "solved_", clocks) if solved_given else None,
        descended_from=point.get_int("descended_from", minimum=0) if "descended_from" in fields else None,
        late_begins=point.get_int("late_begins", minimum=0) if "late_begins" in fields else None,
    )


def _read_json(path: str | os.PathLike[str]) -> Any:
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except OSError as exc:
        raise PlanFormatError(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PlanFormatError(f"{os.fspath(path)}: not valid JSON: {exc}") from exc
    return _parse_json(text, os.fspath(path))


def _parse_json(text: str, source: str) -> Any:
    def reject(constant: str) -> None:
        raise PlanFormatError(f"{source}: {constant} is not allowed in a plan document")

    try:
        return json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as exc:
        raise PlanFormatError(f"{source}: not valid JSON: {exc}") from exc


def _read_header(doc: Reader, expected: str, versions: tuple[int, ...]) -> PlanMeta:
    fmt = doc.get_str("format")
    if fmt != expected:
        raise doc.error("format", f"is '{fmt}', expected '{expected}'")
    version = doc.get_int("version")
    if version not in versions:
        readable = " or ".join(map(str, versions))
        raise doc.error("version", f"{version} is not supported (this Perseus reads version {readable})")
    meta = doc.child("meta")
    return PlanMeta(
        profile_digest=meta.get_str("profile_digest"),
        profile_source=meta.get_str("profile_source"),
        schedule=meta.get_str("schedule"),
        num_stages=meta.get_int("num_stages", minimum=1),
        num_microbatches=meta.get_int("num_microbatches", minimum=1),
        num_chunks=meta.get_int("num_chunks", minimum=1),
        unit_time_s=meta.get_float("unit_time_s", minimum=0.0),
        p_block_w=meta.get_float("p_block_w", minimum=0.0),
    )


def _entry(entry: Reader) -> tuple[ScheduleStep, int]:
    entry.as_dict()
    step: ScheduleStep = (
        entry.child("instruction").as_instruction(),
        entry.get_int("microbatch", minimum=0),
        entry.get_int("chunk", minimum=0),
    )
    return step, entry.get_int("freq_mhz", minimum=1)


def _triple(step: Reader) -> ScheduleStep:
    if len(step.as_list()) != 3:
        raise step.error(None, "must be [instruction, microbatch, chunk]")
    return (step.child(0).as_instruction(), step.child(1).as_int(minimum=0), step.child(2).as_int(minimum=0))


def _clocks(
    point: Reader, order: tuple[tuple[ScheduleStep, ...], ...], key: str = "clocks_mhz"
) -> tuple[tuple[int, ...], ...]:
    stages = point.items(key)
    if len(stages) != len(order):
        raise point.error(key, f"has {len(stages)} stages, the schedule has {len(order)}")
    result = []
    for s, stage in enumerate(stages):
        clocks = stage.items_of()
        if len(clocks) != len(order[s]):
            raise stage.error(
                None, f"has {len(clocks)} clocks, but stage {s} runs {len(order[s])} computations"
            )
        result.append(tuple(clock.as_int(minimum=1) for clock in clocks))
    return tuple(result)


def _point_clocks(
    point: Reader, order: tuple[tuple[ScheduleStep, ...], ...], prefix: str, base: Rows | None
) -> Rows:
    """A frontier point's clocks: `{prefix}clocks_mhz` (every stage's list), else `{prefix}clock_changes`
    (`[stage, position, clock]` applied to `base`: the previous point's clocks, or this point's).

    A well-formed field is read at once (`_whole_rows`, `_changed_rows`); anything else takes the strict
    walk, which gives the same result or names the field that is wrong."""
    whole, changes = f"{prefix}clocks_mhz", f"{prefix}clock_changes"
    fields = point.as_dict()
    if base is None or changes not in fields:
        read = _whole_rows(fields.get(whole), order)
        return read if read is not None else _clocks(point, order, whole)
    changed_rows = _changed_rows(fields[changes], base)
    return changed_rows if changed_rows is not None else _walk_changes(point, changes, base)


def _walk_changes(point: Reader, changes: str, base: Rows) -> Rows:
    """`base` with the changes under `changes` applied, each field checked (`PlanFormatError` naming it)."""
    changed: dict[int, list[int]] = {}
    for change in point.items(changes):
        if len(change.as_list()) != 3:
            raise change.error(None, "must be [stage, position, clock_mhz]")
        s, k = change.child(0).as_int(minimum=0), change.child(1).as_int(minimum=0)
        clock = change.child(2).as_int(minimum=1)
        if s >= len(base) or k >= len(base[s]):
            raise change.error(None, f"changes stage {s} position {k}, which the schedule does not have")
        changed.setdefault(s, list(base[s]))[k] = clock
    return _with_changed(base, changed)


def _whole_rows(value: Any, order: tuple[tuple[ScheduleStep, ...], ...]) -> Rows | None:
    """`value` as a point's clocks when it is exactly one list of clocks (integers, at least 1) per stage of
    `order`, each as long as the stage's order; None otherwise (`_clocks` then names what is wrong)."""
    if type(value) is not list or len(value) != len(order):
        return None
    rows = []
    for row, steps in zip(value, order, strict=True):
        if type(row) is not list or len(row) != len(steps) or not all(_is_clock(c) for c in row):
            return None
        rows.append(tuple(row))
    return tuple(rows)


def _changed_rows(value: Any, base: Rows) -> Rows | None:
    """`base` with the `[stage, position, clock]` changes of `value` applied, when every change is well
    formed and inside the schedule; None otherwise (the strict walk then names what is wrong)."""
    if type(value) is not list:
        return None
    changed: dict[int, list[int]] = {}
    for change in value:
        if type(change) is not list or len(change) != 3:
            return None
        s, k, clock = change
        if type(s) is not int or type(k) is not int or not _is_clock(clock):
            return None
        if not (0 <= s < len(base) and 0 <= k < len(base[s])):
            return None
        changed.setdefault(s, list(base[s]))[k] = clock
    return _with_changed(base, changed)


def _with_changed(base: Rows, changed: dict[int, list[int]]) -> Rows:
    """`base` with the rows of the stages in `changed` replaced (the others shared, not copied)."""
    return tuple(tuple(changed[s]) if s in changed else row for s, row in enumerate(base))


def _is_clock(value: Any) -> bool:
    """An integer clock (never a boolean) of at least 1 MHz."""
    return type(value) is int and value >= 1


def _plan(
    doc: Reader,
    meta: PlanMeta,
    index: int | None,
    order: tuple[tuple[ScheduleStep, ...], ...],
    clocks: tuple[tuple[int, ...], ...],
    followed: Followed | None,
) -> Plan:
    fields = doc.as_dict()
    return Plan(
        meta=meta,
        index=index,
        quant_time=doc.get_int("quant_time", minimum=0),
        time_s=doc.get_float("time_s", minimum=0.0),
        model_energy_j=doc.get_float("model_energy_j"),
        refined_energy_j=doc.get_float("refined_energy_j"),
        order=order,
        clocks_mhz=clocks,
        refined_time_s=doc.get_float("refined_time_s", minimum=0.0) if "refined_time_s" in fields else None,
        followed=followed,
    )


def _check_order(source: str, meta: PlanMeta, order: Sequence[Sequence[ScheduleStep]]) -> None:
    """The stages must match the metadata and, for a named schedule, run exactly its order."""
    if len(order) != meta.num_stages:
        raise PlanFormatError(
            f"{source}: {len(order)} stages of clocks, meta.num_stages is {meta.num_stages}"
        )
    try:
        if meta.schedule not in SCHEDULES:
            from_stage_orders(order, meta.num_microbatches, meta.num_chunks, meta.schedule)
            return
        expected = build_dag(meta.schedule, meta.num_stages, meta.num_microbatches, meta.num_chunks)
    except PlanningError as exc:
        raise PlanFormatError(f"{source}: the clocks do not fit the schedule: {exc}") from exc
    for s, ids in enumerate(expected.stage_orders):
        if len(order[s]) != len(ids):
            raise PlanFormatError(
                f"{source}: stage {s} has {len(order[s])} clocks, its schedule has {len(ids)}"
            )
        for k, node in enumerate(ids):
            comp = expected.computations[node]
            wanted: ScheduleStep = (comp.instruction, comp.microbatch, comp.chunk)
            if order[s][k] != wanted:
                raise PlanFormatError(
                    f"{source}: stage {s} entry {k} is {_label(order[s][k])}, "
                    f"but schedule {meta.schedule} runs {_label(wanted)} there"
                )


def _label(step: ScheduleStep) -> str:
    instruction, microbatch, chunk = step
    return f"{Instruction(instruction).value} of microbatch {microbatch} chunk {chunk}"

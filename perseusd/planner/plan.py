"""Frequency plans and frontiers as versioned JSON documents: data, never code.

A plan (`"format": "perseus-plan"`) holds its metadata and one clock per computation, per stage in schedule
order. A frontier (`"format": "perseus-frontier"`) holds the metadata and the schedule order once, then every
point with its time, energies and per-stage clock lists. Loading is strict: anything malformed is a
`PlanFormatError` naming the file and the field. JSON is parsed with `json`, nothing is ever evaluated.
See `docs/planner.md` for the schema by example.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

from perseusd.errors import PlanFormatError, PlanningError
from perseusd.planner.dag import ComputationDag, Instruction, ScheduleStep, build_dag, from_stage_orders
from perseusd.planner.plan_schema import Reader
from perseusd.planner.profile import Profile

PLAN_FORMAT = "perseus-plan"
FRONTIER_FORMAT = "perseus-frontier"
FORMAT_VERSION = 1
NAMED_SCHEDULES = ("1f1b", "gpipe", "interleaved")


class PlanPoint(Protocol):
    """What a plan is made from: a solver `FrontierPoint` or anything with the same fields."""

    @property
    def quant_time(self) -> int: ...
    @property
    def time_s(self) -> float: ...
    @property
    def model_energy_j(self) -> float: ...
    @property
    def refined_energy_j(self) -> float: ...
    @property
    def clocks_mhz(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class PlanMeta:
    """Where a plan comes from: the profile, the schedule and the solver parameters."""

    profile_digest: str
    profile_source: str
    schedule: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    unit_time_s: float
    p_block_w: float

    @classmethod
    def for_dag(cls, dag: ComputationDag, profile: Profile, unit_time_s: float, p_block_w: float) -> PlanMeta:
        """The metadata of plans for `dag` solved on `profile` with these parameters."""
        return cls(
            profile.digest(),
            profile.source,
            dag.schedule,
            dag.num_stages,
            dag.num_microbatches,
            dag.num_chunks,
            unit_time_s,
            p_block_w,
        )

    def to_json(self) -> dict[str, Any]:
        """The `meta` object of a document."""
        return {
            "profile_digest": self.profile_digest,
            "profile_source": self.profile_source,
            "schedule": self.schedule,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "unit_time_s": self.unit_time_s,
            "p_block_w": self.p_block_w,
        }


@dataclass(frozen=True)
class Plan:
    """A loaded frequency plan: one clock per computation, per stage in schedule order."""

    meta: PlanMeta
    index: int | None
    quant_time: int
    time_s: float
    model_energy_j: float
    refined_energy_j: float
    order: tuple[tuple[ScheduleStep, ...], ...]
    clocks_mhz: tuple[tuple[int, ...], ...]

    def node_clocks_mhz(self) -> tuple[int, ...]:
        """The clocks indexed by DAG node id (nodes are numbered stage by stage in schedule order)."""
        return tuple(clock for stage in self.clocks_mhz for clock in stage)

    def dag(self) -> ComputationDag:
        """The DAG this plan runs on, rebuilt from its schedule order."""
        return from_stage_orders(
            self.order, self.meta.num_microbatches, self.meta.num_chunks, self.meta.schedule
        )

    def check_profile(self, profile: Profile) -> None:
        """Raise `PlanFormatError` unless `profile` is the profile this plan was made from."""
        if profile.digest() != self.meta.profile_digest:
            raise PlanFormatError(
                f"the plan was made from profile {self.meta.profile_source} ({self.meta.profile_digest}), "
                f"not from {profile.source} ({profile.digest()}): solve again with this profile"
            )


@dataclass(frozen=True)
class Frontier:
    """A loaded frontier: every point as a `Plan`, in emission order."""

    meta: PlanMeta
    order: tuple[tuple[ScheduleStep, ...], ...]
    points: tuple[Plan, ...]


def _per_stage(dag: ComputationDag, clocks_mhz: Sequence[int]) -> list[list[int]]:
    if len(clocks_mhz) != dag.num_computations:
        raise PlanningError(f"{len(clocks_mhz)} clocks for a DAG of {dag.num_computations} computations")
    # itemgetter picks a stage's clocks in C: this runs for every stage at every frontier point.
    return [
        list(itemgetter(*ids)(clocks_mhz)) if len(ids) > 1 else [clocks_mhz[i] for i in ids]
        for ids in dag.stage_orders
    ]


def _point_fields(point: PlanPoint) -> dict[str, Any]:
    return {
        "quant_time": point.quant_time,
        "time_s": point.time_s,
        "model_energy_j": point.model_energy_j,
        "refined_energy_j": point.refined_energy_j,
    }


def _step_json(dag: ComputationDag, node: int) -> tuple[str, int, int]:
    comp = dag.computations[node]
    return comp.instruction.value, comp.microbatch, comp.chunk


def plan_from_point(dag: ComputationDag, point: PlanPoint, meta: PlanMeta) -> dict[str, Any]:
    """The `perseus-plan` document of one frontier point, clocks written per stage in schedule order."""
    order = [[_step_json(dag, node) for node in ids] for ids in dag.stage_orders]
    return _write_plan(meta.to_json(), _point_fields(point), order, _per_stage(dag, point.clocks_mhz))


def plan_from_frontier_document(frontier: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The `perseus-plan` document of point `index` of a `perseus-frontier` document (as `frontier_document`
    writes it, or the daemon's switch-aware copy), with the point's index."""
    point = frontier["points"][index]
    fields = {key: point[key] for key in _PLAN_FIELDS}
    return _write_plan(frontier["meta"], fields, frontier["order"], point["clocks_mhz"], index=index)


_PLAN_FIELDS = ("quant_time", "time_s", "model_energy_j", "refined_energy_j")


def _write_plan(
    meta_json: Any,
    fields: Mapping[str, Any],
    order: Sequence[Sequence[Sequence[Any]]],
    clocks_mhz: Sequence[Sequence[int]],
    index: int | None = None,
) -> dict[str, Any]:
    """The one writer of `perseus-plan` documents: per stage, each computation of `order` with its clock."""
    stages = [
        [
            {"instruction": step[0], "microbatch": step[1], "chunk": step[2], "freq_mhz": int(clock)}
            for step, clock in zip(stage_order, stage_clocks, strict=True)
        ]
        for stage_order, stage_clocks in zip(order, clocks_mhz, strict=True)
    ]
    header = {"format": PLAN_FORMAT, "version": FORMAT_VERSION, "meta": meta_json}
    numbered = {} if index is None else {"index": index}
    return header | numbered | dict(fields) | {"stages": stages}


def frontier_document(dag: ComputationDag, points: Iterable[PlanPoint], meta: PlanMeta) -> dict[str, Any]:
    """The `perseus-frontier` document: metadata and schedule order once, then every point, in order."""
    order = [[list(_step_json(dag, node)) for node in ids] for ids in dag.stage_orders]
    body = [
        {"index": i} | _point_fields(p) | {"clocks_mhz": _per_stage(dag, p.clocks_mhz)}
        for i, p in enumerate(points)
    ]
    header = {"format": FRONTIER_FORMAT, "version": FORMAT_VERSION, "meta": meta.to_json()}
    return header | {"order": order, "points": body}


def frontier_json_text(dag: ComputationDag, points: Iterable[PlanPoint], meta: PlanMeta) -> str:
    """`json.dumps(frontier_document(dag, points, meta), allow_nan=False)`, the same text, written fast: the
    points go straight from the solver's per-node clocks to text (in C where it was built), without the
    per-stage lists the document holds."""
    from perseusd.planner.frontier_text import frontier_json, points_json

    points = list(points)
    rows = [
        (i, p.quant_time, p.time_s, p.model_energy_j, p.refined_energy_j, p.clocks_mhz)
        for i, p in enumerate(points)
    ]
    text = points_json(rows, dag.stage_orders)
    if text is None:
        return frontier_json(frontier_document(dag, points, meta))
    head = json.dumps(frontier_document(dag, [], meta), allow_nan=False)
    if not head.endswith("[]}"):  # pragma: no cover - the document ends with its points
        raise AssertionError("a frontier document ends with its points")
    return f"{head[:-2]}{text}]}}"


def save_json(doc: dict[str, Any], path: str | os.PathLike[str], indent: int | None = None) -> None:
    """Write `doc` to `path` atomically (a temporary file in the same folder, fsync, rename)."""
    save_json_text(json.dumps(doc, indent=indent, allow_nan=False), path)


def save_json_text(text: str, path: str | os.PathLike[str], durable: bool = True) -> None:
    """Write JSON text (see `frontier_text.frontier_json`) to `path` atomically, as `save_json` does.

    Readers never see a partial file either way; `durable=False` skips the fsync (which makes the file
    survive a power loss), for a command's output that can be made again, as compilers do.
    """
    target = Path(path)
    text += "\n"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as stream:
            stream.write(text)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Load and check a `perseus-plan` document; raises `PlanFormatError` when anything is wrong."""
    return _plan_document(Reader(os.fspath(path), _read_json(path)))


def parse_plan(text: str, source: str) -> Plan:
    """`load_plan` for a document received as text (`source` names it in errors)."""
    return _plan_document(Reader(source, _parse_json(text, source)))


def _plan_document(doc: Reader) -> Plan:
    meta = _read_header(doc, PLAN_FORMAT)
    order: list[tuple[ScheduleStep, ...]] = []
    clocks: list[tuple[int, ...]] = []
    for stage in doc.items("stages"):
        steps = [_entry(entry) for entry in stage.items_of()]
        order.append(tuple(step for step, _ in steps))
        clocks.append(tuple(clock for _, clock in steps))
    _check_order(doc.source, meta, order)
    return _plan(doc, meta, None, tuple(order), tuple(clocks))


def load_frontier(path: str | os.PathLike[str]) -> Frontier:
    """Load and check a `perseus-frontier` document; raises `PlanFormatError` when anything is wrong."""
    return _frontier_document(Reader(os.fspath(path), _read_json(path)))


def parse_frontier(text: str, source: str) -> Frontier:
    """`load_frontier` for a document received as text (`source` names it in errors)."""
    return _frontier_document(Reader(source, _parse_json(text, source)))


def _frontier_document(doc: Reader) -> Frontier:
    meta = _read_header(doc, FRONTIER_FORMAT)
    order = tuple(tuple(_triple(step) for step in stage.items_of()) for stage in doc.items("order"))
    _check_order(doc.source, meta, order)
    points = tuple(
        _plan(point, meta, point.get_int("index", minimum=0), order, _clocks(point, order))
        for point in doc.items("points")
    )
    return Frontier(meta, order, points)


def plan_from_frontier(frontier: Frontier, index: int) -> Plan:
    """One point of a loaded frontier (by emission index) as a plan."""
    for point in frontier.points:
        if point.index == index:
            return point
    raise PlanFormatError(
        f"the frontier has no point with index {index} (it has {len(frontier.points)} points)"
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


def _read_header(doc: Reader, expected: str) -> PlanMeta:
    fmt = doc.get_str("format")
    if fmt != expected:
        raise doc.error("format", f"is '{fmt}', expected '{expected}'")
    version = doc.get_int("version")
    if version != FORMAT_VERSION:
        raise doc.error(
            "version", f"{version} is not supported (this Perseus reads version {FORMAT_VERSION})"
        )
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


def _clocks(point: Reader, order: tuple[tuple[ScheduleStep, ...], ...]) -> tuple[tuple[int, ...], ...]:
    stages = point.items("clocks_mhz")
    if len(stages) != len(order):
        raise point.error("clocks_mhz", f"has {len(stages)} stages, the schedule has {len(order)}")
    result = []
    for s, stage in enumerate(stages):
        clocks = stage.items_of()
        if len(clocks) != len(order[s]):
            raise stage.error(
                None, f"has {len(clocks)} clocks, but stage {s} runs {len(order[s])} computations"
            )
        result.append(tuple(clock.as_int(minimum=1) for clock in clocks))
    return tuple(result)


def _plan(
    doc: Reader,
    meta: PlanMeta,
    index: int | None,
    order: tuple[tuple[ScheduleStep, ...], ...],
    clocks: tuple[tuple[int, ...], ...],
) -> Plan:
    return Plan(
        meta=meta,
        index=index,
        quant_time=doc.get_int("quant_time", minimum=0),
        time_s=doc.get_float("time_s", minimum=0.0),
        model_energy_j=doc.get_float("model_energy_j"),
        refined_energy_j=doc.get_float("refined_energy_j"),
        order=order,
        clocks_mhz=clocks,
    )


def _check_order(source: str, meta: PlanMeta, order: Sequence[Sequence[ScheduleStep]]) -> None:
    """The stages must match the metadata and, for a named schedule, run exactly its order."""
    if len(order) != meta.num_stages:
        raise PlanFormatError(
            f"{source}: {len(order)} stages of clocks, meta.num_stages is {meta.num_stages}"
        )
    try:
        if meta.schedule not in NAMED_SCHEDULES:
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

"""Frequency plans and frontiers as versioned JSON documents: data, never code.

A plan (`"format": "perseus-plan"`) holds its metadata and one clock per computation, per stage in schedule
order. A frontier (`"format": "perseus-frontier"`) holds the metadata and the schedule order once, then every
point with its time and energies; the first point's clocks are written whole (per-stage lists), every later
point's as the few clocks that differ from the point before (`clock_changes`). This module holds the types
and the one writer of each document; `plan_read` loads them (strictly). See `docs/planner.md` for the schema
by example.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import compress
from operator import itemgetter, ne
from pathlib import Path
from typing import Any, Protocol

from perseusd.errors import PlanFormatError, PlanningError
from perseusd.planner.dag import ComputationDag, Instruction, ScheduleStep, from_stage_orders
from perseusd.planner.profile import Profile

PLAN_FORMAT = "perseus-plan"
FRONTIER_FORMAT = "perseus-frontier"
PLAN_VERSION = 1
FRONTIER_VERSION = 2
"""Version 2 writes a point's clocks as changes from the point before; version 1 (every point's clocks whole,
32 MB for 8 stages x 96 microbatches) is still read: job caches and saved frontiers hold it."""
FRONTIER_VERSIONS_READ = (1, 2)


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
        """The `meta` object of a document: every field, by name, in order."""
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    """A frequency plan (loaded, or a point of a `Frontier`): one clock per computation, per stage in schedule
    order."""

    meta: PlanMeta
    index: int | None
    quant_time: int
    time_s: float
    model_energy_j: float
    refined_energy_j: float
    order: tuple[tuple[ScheduleStep, ...], ...]
    clocks_mhz: tuple[tuple[int, ...], ...]
    refined_time_s: float | None = None
    """The iteration time on the measured profile (the daemon's frontiers; None in `perseusctl solve`'s)."""
    followed: Followed | None = None
    """What the GPUs will really run at this point (the daemon's switch-aware frontiers; else None)."""

    @property
    def predicted_time_s(self) -> float:
        """The time a point is chosen by: the refined time when known, else the solver's."""
        return self.time_s if self.refined_time_s is None else self.refined_time_s

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
class Followed:
    """A frontier point as the GPUs will really run it, clock-switch latency included (`follow_frontier`).

    The point's own `refined_time_s` / `refined_energy_j` are then the effective plan's; these keep the rest.
    """

    planned_time_s: float
    """The solver's refined time of the planned clocks."""
    planned_energy_j: float
    effective_clocks_mhz: tuple[tuple[int, ...], ...]
    """Per stage, in schedule order: the clocks the computations will really run at."""
    switch_changed: int
    """Computations that will not run at their planned clock."""
    solved_clocks_mhz: tuple[tuple[int, ...], ...] | None = None
    """The solver's clocks when short lowered runs were merged (the point's clocks are the merged ones)."""
    descended_from: int | None = None
    """The point whose followed plan the switch-aware descent started from (`switch_search`); None: a solver
    point."""
    late_begins: int | None = None
    """Computations that begin before their planned clock is applied, as the switch model counts them
    (`switching.late_begins`, summed over the stages); None: not counted (a document without it)."""


@dataclass(frozen=True)
class SwitchingMeta:
    """The clock-switch model (s) a frontier's points were followed under (`switching.SwitchModel`)."""

    latency_s: float
    lead_s: float
    min_run_s: float


@dataclass(frozen=True)
class Frontier:
    """A frontier: every point as a `Plan`, in emission order. What the daemon's solver worker returns and
    keeps (immutable and compact: the schedule order once, equal stage rows of clocks shared by the points);
    `frontier_to_document` writes it as a `perseus-frontier` document and `parse_frontier` reads one back."""

    meta: PlanMeta
    order: tuple[tuple[ScheduleStep, ...], ...]
    points: tuple[Plan, ...]
    switching: SwitchingMeta | None = None
    """The switch model the points were followed under (None: switches were taken as instant)."""


Rows = tuple[tuple[int, ...], ...]
"""Clocks per stage, in schedule order."""


def _per_stage(dag: ComputationDag, clocks_mhz: Sequence[int]) -> Rows:
    if len(clocks_mhz) != dag.num_computations:
        raise PlanningError(f"{len(clocks_mhz)} clocks for a DAG of {dag.num_computations} computations")
    # itemgetter picks a stage's clocks in C: this runs for every stage at every frontier point.
    return tuple(
        itemgetter(*ids)(clocks_mhz) if len(ids) > 1 else tuple(clocks_mhz[i] for i in ids)
        for ids in dag.stage_orders
    )


class RowSharer:
    """Hands out one tuple object for equal rows of clocks seen in a row: consecutive frontier points change
    only a few stages, so a frontier holds (and pickles, as references) each distinct row about once."""

    def __init__(self) -> None:
        self._last: Rows = ()

    def share(self, rows: Sequence[Sequence[int]]) -> Rows:
        """`rows` as tuples, a row equal to the previous call's row of the same stage being that object."""
        last = self._last
        shared = tuple(
            last[s] if s < len(last) and last[s] == tuple(row) else tuple(row) for s, row in enumerate(rows)
        )
        self._last = shared
        return shared


def _point_fields(point: PlanPoint | Plan) -> dict[str, Any]:
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


def plan_document(plan: Plan) -> dict[str, Any]:
    """The `perseus-plan` document of a plan (a frontier's point keeps its index)."""
    fields = _point_fields(plan)
    if plan.refined_time_s is not None:
        fields["refined_time_s"] = plan.refined_time_s
    return _write_plan(
        plan.meta.to_json(), fields, _order_json(plan.order), plan.clocks_mhz, index=plan.index
    )


def _order_json(order: Sequence[Sequence[ScheduleStep]]) -> list[list[list[Any]]]:
    return [[[Instruction(step[0]).value, step[1], step[2]] for step in stage] for stage in order]


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
    header = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "meta": meta_json}
    numbered = {} if index is None else {"index": index}
    return header | numbered | dict(fields) | {"stages": stages}


def frontier_from_points(
    dag: ComputationDag,
    points: Iterable[PlanPoint],
    meta: PlanMeta,
    refined_times_s: Sequence[float] | None = None,
) -> Frontier:
    """The frontier of solver points on `dag`, numbered in order (`refined_times_s`: each point's time on the
    measured profile, when known)."""
    order = tuple(tuple(_step(dag, node) for node in ids) for ids in dag.stage_orders)
    rows = RowSharer()
    plans = tuple(
        Plan(
            meta,
            i,
            p.quant_time,
            p.time_s,
            p.model_energy_j,
            p.refined_energy_j,
            order,
            rows.share(_per_stage(dag, p.clocks_mhz)),
            refined_time_s=None if refined_times_s is None else refined_times_s[i],
        )
        for i, p in enumerate(points)
    )
    return Frontier(meta, order, plans)


def _step(dag: ComputationDag, node: int) -> ScheduleStep:
    comp = dag.computations[node]
    return comp.instruction, comp.microbatch, comp.chunk


def frontier_to_document(frontier: Frontier) -> dict[str, Any]:
    """The one writer of `perseus-frontier` documents: metadata and schedule order once, then every point
    (its clocks as changes from the point before, `clock_changes`)."""
    body = []
    previous: Rows | None = None
    for i, point in enumerate(frontier.points):
        body.append(_frontier_point_json(i, point, previous))
        previous = point.clocks_mhz
    header = {"format": FRONTIER_FORMAT, "version": FRONTIER_VERSION, "meta": frontier.meta.to_json()}
    doc = header | {"order": _order_json(frontier.order), "points": body}
    switching = frontier.switching
    if switching is not None:
        doc["switching"] = {
            "latency_s": switching.latency_s,
            "lead_s": switching.lead_s,
            "min_run_s": switching.min_run_s,
        }
    return doc


def _frontier_point_json(position: int, point: Plan, previous: Rows | None) -> dict[str, Any]:
    index = position if point.index is None else point.index
    body = {"index": index} | _point_fields(point) | _clocks_json("", point.clocks_mhz, previous)
    if point.refined_time_s is not None:
        body["refined_time_s"] = point.refined_time_s
    followed = point.followed
    if followed is not None:
        if followed.solved_clocks_mhz is not None:
            body |= _clocks_json("solved_", followed.solved_clocks_mhz, point.clocks_mhz)
        body["planned_time_s"] = followed.planned_time_s
        body["planned_energy_j"] = followed.planned_energy_j
        body |= _clocks_json("effective_", followed.effective_clocks_mhz, point.clocks_mhz)
        body["switch_changed"] = followed.switch_changed
        if followed.descended_from is not None:
            body["descended_from"] = followed.descended_from
        if followed.late_begins is not None:
            body["late_begins"] = followed.late_begins
    return body


def _clocks_json(prefix: str, rows: Rows, base: Rows | None) -> dict[str, Any]:
    """A point's clocks in a frontier document: `{prefix}clocks_mhz`, every stage's list, without a `base`
    of the same shape; else `{prefix}clock_changes`, the `[stage, position, clock]` where `rows` differ from
    `base` (a few, where the lists would repeat every clock of every stage)."""
    if base is None or list(map(len, base)) != list(map(len, rows)):
        return {f"{prefix}clocks_mhz": [list(row) for row in rows]}
    changes = [
        [s, k, row[k]]
        for s, (row, old) in enumerate(zip(rows, base, strict=True))
        if row is not old and row != old
        for k in compress(range(len(row)), map(ne, row, old))  # in C: this runs for every changed row
    ]
    return {f"{prefix}clock_changes": changes}


def frontier_document(dag: ComputationDag, points: Iterable[PlanPoint], meta: PlanMeta) -> dict[str, Any]:
    """The `perseus-frontier` document of solver points (`frontier_from_points`, `frontier_to_document`)."""
    return frontier_to_document(frontier_from_points(dag, points, meta))


def save_json(
    doc: dict[str, Any], path: str | os.PathLike[str], indent: int | None = None, durable: bool = True
) -> None:
    """Write `doc` to `path` atomically (a temporary file in the same folder, fsync, rename).

    Readers never see a partial file either way; `durable=False` skips the fsync (which makes the file
    survive a power loss), for a command's output that can be made again, as compilers do.
    """
    target = Path(path)
    text = json.dumps(doc, indent=indent, allow_nan=False) + "\n"
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


def plan_from_frontier(frontier: Frontier, index: int) -> Plan:
    """One point of a loaded frontier (by emission index) as a plan."""
    for point in frontier.points:
        if point.index == index:
            return point
    raise PlanFormatError(
        f"the frontier has no point with index {index} (it has {len(frontier.points)} points)"
    )

"""The registry of named pipeline schedules: the one place a schedule is added.

Each entry says how every stage orders its computations (`perseusd.planner.schedule_orders`), which shapes
it runs (chunks per stage, microbatches), where a stage's chunks sit in the model (`layout`) and whether its
backwards are split into input and weight gradients. The planner (`build_dag`), the daemon's registration
check, the emulator and `perseusctl` all read it. The names on the wire, and which of them split the
backward, are the protocol's (`perseus_client.message.Schedule`, `SPLIT_BACKWARD_SCHEDULES`: the client
reports the instructions by them); `OBSERVED` is the one wire name that is not a fixed order (learned from a
job's events).

Adding a schedule: its order function in `schedule_orders.py`, an entry here, its name in the protocol's
`Schedule` (with `VALUE_SINCE` for a new minor), and its client integration's mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from perseus_client.message import SPLIT_BACKWARD_SCHEDULES, Instruction, Schedule

from perseusd.errors import PlanningError
from perseusd.planner.schedule_orders import (
    ScheduleStep,
    gpipe_order,
    interleaved_order,
    interleaved_zero_bubble_order,
    one_f_one_b_order,
    zbv_order,
    zero_bubble_rounds,
)

OBSERVED = "observed"
"""The schedule a daemon learns from a job's events (its orders are not known in advance)."""
Layout = Literal["loop", "v"]
"""Where chunk c of stage s sits in the model: "loop": model stage c S + s (chunk 0 on every stage, then
chunk 1, ...); "v": chunk 0 at s, chunk 1 at 2 S - 1 - s (down the stages and back up)."""
OrderOf = Callable[[int, int, int, int], list[ScheduleStep]]
"""(stages, microbatches, chunks, stage) -> that stage's order."""


@dataclass(frozen=True)
class ScheduleSpec:
    """One named schedule."""

    name: str
    title: str
    """What users call it (error messages, `perseusctl`'s help)."""
    order: OrderOf
    min_chunks: int = 1
    max_chunks: int | None = 1
    """Model chunks per stage it runs (None: any number)."""
    layout: Layout = "loop"
    microbatch_rule: Callable[[int, int], str | None] = lambda _stages, _microbatches: None
    """(stages, microbatches) -> why it cannot run them, or None."""

    @property
    def split_backward(self) -> bool:
        """Backwards run as two computations, the input gradient then (later) the weight gradient."""
        return self.name in SPLIT_BACKWARD_SCHEDULES

    @property
    def instructions(self) -> tuple[Instruction, ...]:
        """The instructions each microbatch runs on each chunk."""
        return instructions_of(self.split_backward)

    def problem(self, num_stages: int, num_microbatches: int, num_chunks: int) -> str | None:
        """Why this schedule cannot run the shape, or None."""
        if num_chunks < self.min_chunks or (self.max_chunks is not None and num_chunks > self.max_chunks):
            return f"{self.title} runs {self._chunks_text()} per stage (got {num_chunks})"
        return self.microbatch_rule(num_stages, num_microbatches)

    def orders(self, num_stages: int, num_microbatches: int, num_chunks: int) -> list[list[ScheduleStep]]:
        """Every stage's order; raises `PlanningError` for a shape it cannot run."""
        problem = self.problem(num_stages, num_microbatches, num_chunks)
        if problem is not None:
            raise PlanningError(problem)
        return [self.order(num_stages, num_microbatches, num_chunks, s) for s in range(num_stages)]

    def _chunks_text(self) -> str:
        if self.max_chunks == self.min_chunks:
            return "one chunk" if self.min_chunks == 1 else f"{self.min_chunks} chunks"
        return f"{self.min_chunks} or more chunks"


def instructions_of(split_backward: bool) -> tuple[Instruction, ...]:
    """The instructions of a microbatch on one chunk: forward and backward, or the backward's two halves."""
    if split_backward:
        return (Instruction.FORWARD, Instruction.BACKWARD_INPUT, Instruction.BACKWARD_WEIGHT)
    return (Instruction.FORWARD, Instruction.BACKWARD)


def model_stage(layout: Layout, num_stages: int, stage: int, chunk: int) -> int:
    """The model stage that chunk `chunk` of stage `stage` runs (its data comes from the one before it)."""
    if layout == "v" and chunk % 2:
        return (chunk + 1) * num_stages - 1 - stage
    return chunk * num_stages + stage


def _multiple_of_stages(stages: int, microbatches: int) -> str | None:
    if microbatches % stages:
        return f"interleaved 1F1B needs microbatches ({microbatches}) to be a multiple of stages ({stages})"
    return None


def _multiple_of_rounds(stages: int, microbatches: int) -> str | None:
    rounds = zero_bubble_rounds(stages, microbatches)
    if microbatches % rounds:
        return (
            f"interleaved zero bubble needs microbatches ({microbatches}) to be a multiple of its rounds "
            f"({rounds}: microbatches // stages)"
        )
    return None


SCHEDULES: Mapping[str, ScheduleSpec] = {
    spec.name: spec
    for spec in (
        ScheduleSpec("1f1b", "1F1B", lambda s, m, _c, stage: one_f_one_b_order(s, m, stage)),
        ScheduleSpec("gpipe", "GPipe", lambda _s, m, _c, _stage: gpipe_order(m)),
        ScheduleSpec(
            "interleaved",
            "interleaved 1F1B",
            interleaved_order,
            max_chunks=None,
            microbatch_rule=_multiple_of_stages,
        ),
        ScheduleSpec(
            "interleaved_zb",
            "interleaved zero bubble",
            interleaved_zero_bubble_order,
            max_chunks=None,
            microbatch_rule=_multiple_of_rounds,
        ),
        ScheduleSpec(
            "zbv",
            "zero bubble V",
            lambda s, m, _c, stage: zbv_order(s, m, stage),
            min_chunks=2,
            max_chunks=2,
            layout="v",
        ),
    )
}
"""Every named schedule, by its wire name."""
NAMES: tuple[str, ...] = tuple(SCHEDULES)
"""The named schedules (every wire schedule but "observed")."""
WIRE_NAMES: tuple[str, ...] = get_args(Schedule)
"""Every schedule a job may register: the named ones and "observed" (a test checks they agree)."""


def spec_of(schedule: str) -> ScheduleSpec:
    """The named schedule; raises `PlanningError` for another name."""
    spec = SCHEDULES.get(schedule)
    if spec is None:
        raise PlanningError(f"unknown schedule '{schedule}' (expected {', '.join(NAMES)})")
    return spec


def layout_of(schedule: str) -> Layout:
    """A schedule's layout ("loop" for a learned or custom one)."""
    spec = SCHEDULES.get(schedule)
    return "loop" if spec is None else spec.layout

"""The registry of named pipeline schedules: the one place a schedule is added.

Each entry says how every stage orders its computations (`perseusd.planner.schedule_orders`) and which
shapes it runs (chunks per stage, microbatches). The planner (`build_dag`), the daemon's registration check,
the emulator and `perseusctl` all read it. The names on the wire are the protocol's
(`perseus_client.message.Schedule`); `OBSERVED` is the one wire name that is not a fixed order (learned from
a job's events).

Adding a schedule: its order function in `schedule_orders.py`, an entry here, its name in the protocol's
`Schedule` (with `VALUE_SINCE` for a new minor), and its client integration's mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import get_args

from perseus_client.message import Schedule

from perseusd.errors import PlanningError
from perseusd.planner.schedule_orders import (
    ScheduleStep,
    gpipe_order,
    interleaved_order,
    one_f_one_b_order,
)

OBSERVED = "observed"
"""The schedule a daemon learns from a job's events (its orders are not known in advance)."""
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
    microbatch_rule: Callable[[int, int], str | None] = lambda _stages, _microbatches: None
    """(stages, microbatches) -> why it cannot run them, or None."""

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


def _multiple_of_stages(stages: int, microbatches: int) -> str | None:
    if microbatches % stages:
        return f"interleaved 1F1B needs microbatches ({microbatches}) to be a multiple of stages ({stages})"
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

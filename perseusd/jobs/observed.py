"""Learning a stage's schedule order from its events: the sequence of computation begins in one iteration.

An order counts as learned once two consecutive complete iterations began the same computations in the same
order and that order is a valid order for the job's microbatches and chunks (every computation once).
"""

from __future__ import annotations

from perseusd.jobs.shape import StageOrder, step_of
from perseusd.planner.dag import ScheduleStep

MAX_ORDER_LENGTH = 2 * 4096 * 64


class OrderLearner:
    """Watches one GPU's begins between its step events."""

    def __init__(self, num_microbatches: int, chunks: int) -> None:
        self._expected = 2 * num_microbatches * chunks
        self._current: list[ScheduleStep] | None = None
        self._previous: StageOrder | None = None
        self.learned: StageOrder | None = None

    def step_begin(self) -> None:
        self._current = []

    def computation_begin(self, instruction: str, microbatch: int, chunk: int) -> None:
        if self._current is not None and len(self._current) < MAX_ORDER_LENGTH:
            self._current.append(step_of(instruction, microbatch, chunk))

    def step_end(self) -> None:
        if self._current is None:
            return
        order = tuple(self._current)
        self._current = None
        if len(order) != self._expected or len(set(order)) != len(order):
            self._previous = None
            return
        if self.learned is None and order == self._previous:
            self.learned = order
        self._previous = order

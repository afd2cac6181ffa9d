"""Computation and step events: order checks per leased GPU and counters (no per-event logging)."""

from __future__ import annotations

from collections import Counter

from perseus_client.protocol import (
    ComputationBegin,
    ComputationEnd,
    ErrorCode,
    Message,
    ProtocolError,
    StepBegin,
    StepEnd,
)

_ComputationKey = tuple[int, str, int, int]
MAX_OPEN_COMPUTATIONS = 4096


class EventTracker:
    """Checks that begins and ends pair up per GPU and counts everything received and rejected."""

    def __init__(self) -> None:
        self.received = 0
        self.dropped = 0
        self.lost = 0
        """Events clients sent that the daemon never read, from their end markers (`event_tally`)."""
        self.errors_by_code: Counter[str] = Counter()
        self._open: dict[str, set[_ComputationKey]] = {}
        self._open_step: dict[str, int] = {}
        self.computations_completed = 0
        self.steps_completed = 0

    def reject(self, code: ErrorCode) -> None:
        """Count a rejected event (or request)."""
        self.errors_by_code[code] += 1

    def apply(self, message: Message) -> None:
        """Apply one event of a GPU the sender holds; raises `ProtocolError` (OUT_OF_ORDER, or BAD_FIELD for
        a negative stage, microbatch, chunk, step or timestamp)."""
        if isinstance(message, ComputationBegin | ComputationEnd):
            if min(message.stage, message.microbatch, message.chunk, message.timestamp_ns) < 0:
                raise ProtocolError(
                    ErrorCode.BAD_FIELD, f"{message.TYPE}: stage, microbatch, chunk and timestamp_ns are >= 0"
                )
            self._computation(message)
        elif isinstance(message, StepBegin | StepEnd) and min(message.step, message.timestamp_ns) < 0:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"{message.TYPE}: step and timestamp_ns are >= 0")
        elif isinstance(message, StepBegin):
            if message.gpu in self._open_step:
                raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"step {message.step} begins inside a step")
            self._open_step[message.gpu] = message.step
        elif isinstance(message, StepEnd):
            if self._open_step.get(message.gpu) != message.step:
                raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"step {message.step} ends without its begin")
            del self._open_step[message.gpu]
            self.steps_completed += 1

    def _computation(self, message: ComputationBegin | ComputationEnd) -> None:
        key = (message.stage, message.instruction, message.microbatch, message.chunk)
        open_set = self._open.setdefault(message.gpu, set())
        if isinstance(message, ComputationBegin):
            if key in open_set or len(open_set) >= MAX_OPEN_COMPUTATIONS:
                raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"computation {key} begins twice")
            open_set.add(key)
            return
        if key not in open_set:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"computation {key} ends without its begin")
        open_set.remove(key)
        self.computations_completed += 1

    def forget(self, gpu: str) -> None:
        """Drop the open computations and step of a GPU whose lease ended."""
        self._open.pop(gpu, None)
        self._open_step.pop(gpu, None)

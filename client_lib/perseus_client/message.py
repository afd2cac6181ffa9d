"""The base of every wire message and the protocol's shared literal types (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, TypeAlias

from perseus_client.codes import JobState

Instruction: TypeAlias = Literal["forward", "backward"]
Schedule: TypeAlias = Literal["1f1b", "gpipe", "interleaved", "observed"]
"""How a job's stages order their computations; "observed": learned from the first iterations' events."""
Policy: TypeAlias = Literal["no_slowdown", "fastest", "slowdown", "time", "min_energy", "carbon"]
"""Which frontier point a job runs: the least energy no slower than all-max clocks (default), the fastest,
the least energy within `target` slowdown (a fraction: 0.05 = 5 %), the least energy within `target`
seconds per iteration, or the least energy."""
JOB_STATES = tuple(state.value for state in JobState)
"""Every job state's wire string, in the order a job moves through them."""


@dataclass(frozen=True)
class Message:
    """Base of every message; `TYPE` is the wire `type`, `SINCE` the minor of the major that added it."""

    TYPE: ClassVar[str] = ""
    SINCE: ClassVar[int] = 0


@dataclass(frozen=True)
class ErrorReply(Message):
    """A request refused: a stable `ErrorCode` and why. The same in every version (never add a field), so
    that any client reads why it was refused."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str

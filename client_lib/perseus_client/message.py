"""The base of every wire message and the protocol's shared literal types (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Literal, TypeAlias

from perseus_client.codes import JobState


class Instruction(str, Enum):
    """The kind of a computation: on the wire, in profiles and in plans (its value), daemon and client alike.

    A schedule either runs each microbatch's backward whole (`backward`) or splits it (zero-bubble
    schedules) into the input gradient, which the previous stage waits for, and the weight gradient, which
    nothing waits for but the end of the iteration.
    """

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"
    BACKWARD_WEIGHT = "backward_weight"

    __str__ = str.__str__

    @property
    def letter(self) -> str:
        """One letter for tables and labels: F, B, I (input gradient), W (weight gradient)."""
        return _LETTERS[self.value]


_LETTERS = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


Schedule: TypeAlias = Literal["1f1b", "gpipe", "interleaved", "interleaved_zb", "zbv", "observed"]
"""How a job's stages order their computations, as `torch.distributed.pipelining` and Megatron-LM run them:
1F1B, GPipe, interleaved 1F1B (chunks > 1), interleaved zero bubble (ZB1P, `ScheduleInterleavedZeroBubble`)
and zero bubble V (`ScheduleZBVZeroBubble`, two chunks per stage in a V); "observed": learned from the first
iterations' events. The daemon's planner builds each named one (`perseusd.planner.schedules`)."""
SPLIT_BACKWARD_SCHEDULES = frozenset(("interleaved_zb", "zbv"))
"""The schedules whose backwards are reported and planned as two computations, `backward_input` and
`backward_weight` (every other schedule reports `backward`)."""
VALUE_SINCE: dict[str, int] = {"backward_input": 8, "backward_weight": 8, "interleaved_zb": 8, "zbv": 8}
"""Values of an existing field added by a later minor: a side set to speak an older minor refuses them as
unknown, as a side of that minor would."""
Policy: TypeAlias = Literal["no_slowdown", "fastest", "slowdown", "time", "min_energy", "carbon"]
"""Which frontier point a job runs: the least energy no slower than all-max clocks (default), the fastest,
the least energy within `target` slowdown (a fraction: 0.05 = 5 %), the least energy within `target`
seconds per iteration, or the least energy."""
JOB_STATES = tuple(state.value for state in JobState)
"""Every job state's wire string, in the order a job moves through them."""


@dataclass(frozen=True)
class Message:
    """Base of every message. Its class line names its wire `type` and the minor of the major that added it,
    `class AdminSetCap(Message, wire_type="admin_set_cap", since=1)` (`since` left out: 0); the class body
    holds its fields alone. A subclass that names neither inherits both."""

    TYPE: ClassVar[str] = ""
    """The wire `type`."""
    SINCE: ClassVar[int] = 0
    """The minor of `PROTOCOL_MAJOR` that added the message."""

    def __init_subclass__(cls, *, wire_type: str | None = None, since: int | None = None) -> None:
        super().__init_subclass__()
        if wire_type is not None:
            cls.TYPE = wire_type
        if since is not None:
            cls.SINCE = since


# The bases of messages that begin with the same field: a base's fields come first on the wire, so a message
# derives from one only where that field is its first. Never registered themselves (they have no TYPE).


@dataclass(frozen=True)
class JobMessage(Message):
    """A message about one job, named by `job` (the name it registers under)."""

    job: str


@dataclass(frozen=True)
class GpuMessage(Message):
    """A message about one GPU, named by `gpu` (its UUID)."""

    gpu: str


@dataclass(frozen=True)
class GpusMessage(Message):
    """A message about some GPUs, named by `gpus` (their UUIDs)."""

    gpus: tuple[str, ...]


@dataclass(frozen=True)
class ErrorReply(Message, wire_type="error"):
    """A request refused: a stable `ErrorCode` and why. The same in every version (never add a field), so
    that any client reads why it was refused."""

    code: str
    message: str

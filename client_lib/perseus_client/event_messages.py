"""Event messages of the wire protocol: a computation's or a training step's begin and end on a leased GPU,
the reply to an event sent on the control socket, the per-session event count and the event stream's end
marker. Events are written by `perseus_client.event_frames` and read fast by the daemon
(`perseusd.daemon.event_frames`); `perseus_client.message_types` registers them, `perseus_client.protocol`
re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import GpuMessage, Instruction, Message
from perseus_client.version import since


@dataclass(frozen=True)
class ComputationEvent(GpuMessage):
    """Event: a computation starts or ends on a leased GPU. `timestamp_ns` is the client's
    `time.monotonic_ns()`."""

    stage: int
    instruction: Instruction
    microbatch: int
    chunk: int
    timestamp_ns: int


@dataclass(frozen=True)
class ComputationBegin(ComputationEvent, wire_type="comp_begin"):
    """Event: a computation starts."""


@dataclass(frozen=True)
class ComputationEnd(ComputationEvent, wire_type="comp_end"):
    """Event: a computation ends."""


@dataclass(frozen=True)
class StepEvent(GpuMessage):
    """Event: a training step (one iteration) starts or ends on a leased GPU."""

    step: int
    timestamp_ns: int


@dataclass(frozen=True)
class StepBegin(StepEvent, wire_type="step_begin"):
    """Event: a training step starts."""


@dataclass(frozen=True)
class StepEnd(StepEvent, wire_type="step_end"):
    """Event: a training step ends."""


@dataclass(frozen=True)
class EventAck(Message, wire_type="event_ack"):
    """Reply to an event sent on the control socket (events on the event socket get no reply)."""


@dataclass(frozen=True)
class EventCount(Message, wire_type="event_count"):
    """How many events the daemon read from the calling process since its hello, and how many of those it
    dropped. A client asks when it closes, to count what never arrived (`PerseusClient.events_lost`)."""


@dataclass(frozen=True)
class EventCountOk(Message, wire_type="event_count_ok"):
    received: int
    dropped: int
    ended_sent: int | None = since(9, None)
    """The `sent` of this session's end marker (`events_end`) once the daemon has read it, else None: from
    then on `received` is final, and `sent - received` events never reached the daemon."""


@dataclass(frozen=True)
class EventsEnd(Message, wire_type="events_end", since=9):
    """Event socket, a closing client's last frame: "I sent `sent` events since my hello" (and dropped
    `dropped` before sending: its queue was full or it had no session). Read in stream order, after every
    event before it, so the daemon reconciles the session exactly: read (used or dropped, by reason) and
    lost in transit, `sent - read`. Not an event: never counted as one."""

    sent: int
    dropped: int

"""The Perseus wire protocol, shared by the daemon and the client library (stdlib only).

Every frame is one compact JSON object: ``{"v": MAJOR, "id": REQUEST_ID, "m": MINOR, "type": TYPE, ...}``
(`perseus_client.envelope`; "m" is left out for minor 0). Requests on the control and admin sockets carry
an id (an int > 0) that the reply echoes; events on the event socket are fire-and-forget and carry id 0.
GPUs are named by UUID on the wire, never by index. The daemon decodes requests strictly (`decode`: unknown
types, missing or extra fields and wrong field types are rejected with a stable `ErrorCode`); the client
decodes replies tolerantly (`decode_reply`: fields it does not know are ignored, error replies decode
whatever their version).

The protocol version, (major, minor), is separate from the package version (`perseus_client.version`):
additive changes bump the minor and never break; see docs/protocol.md for how to add a message. Majors
before 6 (one integer, equality on every frame): 2 `set_plan` / `clear_plan` and the `plan` field of a
status GPU row; 3 jobs (`register`, `set_policy`, `jobs`, `frontier`, `plan`, `profile_export`,
`profile_import`), the `jobs` field of a status reply, CLOCK_MONOTONIC event timestamps
(`time.monotonic_ns()`); 4 stragglers (`announce_straggler`), per-pipeline compute time, plan and slowness
in `jobs`, the job's straggler, target time and energy saved; 5 `early_raises` in a plan's status.
Major 6 (minor 0): `event_count`, the `connections` and `connections_refused` fields of the daemon's
health, error code LIMIT; frames are standard JSON (NaN and Infinity refused) with integers of at most 64
bits and finite floats; `energy_read` / `energy_reading`; error code STATE_WRITE_FAILED and the daemon's
`persistence_error`; a GPU row's `power_capped`; the `no_slowdown` policy; measured/predicted energy fields
of `jobs`. Minor 1 and later: see `perseus_client.version`.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.cap_messages import (
    AdminCapStatus,
    AdminClearCap,
    AdminSetCap,
    AdminSetJobPriority,
    CapGpu,
    CapJob,
    CapStatusReply,
    JobPriorityOk,
)
from perseus_client.carbon_messages import CarbonInfo, SignalInfo
from perseus_client.carry_messages import CarriedComputation, Carry, CarryReady
from perseus_client.codes import ErrorCode, ProtocolError
from perseus_client.energy_messages import EnergyRead, EnergyReading, GpuEnergy
from perseus_client.envelope import (
    ADMIN_SOCKET_NAME,
    CONTROL_SOCKET_NAME,
    DEFAULT_MAX_FRAME_BYTES,
    EVENT_SOCKET_NAME,
    MAX_REQUEST_ID,
    SEQPACKET_EVENT_SOCKET_NAME,
    Frame,
    _leading_id,
    decode_frame,
    encode_frame,
)
from perseus_client.event_frames import EventWriter, frame_head
from perseus_client.job_messages import (
    AnnounceStraggler,
    AnnounceStragglerOk,
    DocumentReply,
    FrontierRequest,
    JobInfo,
    JobsReply,
    JobsRequest,
    PipelineInfo,
    PlanningInfo,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    ProfileImportOk,
    ProfileReply,
    ProfilingInfo,
    Register,
    RegisterOk,
    SetPolicy,
    SetPolicyOk,
    SpanInfo,
    SpanMember,
    StragglerInfo,
)
from perseus_client.message import (
    JOB_STATES,
    ErrorReply,
    GpuMessage,
    GpusMessage,
    Instruction,
    JobMessage,
    Message,
    Policy,
    Schedule,
)
from perseus_client.pool_messages import (
    AdminPoolRelease,
    AdminPoolSetBudget,
    AdminPoolStatus,
    PoolBudgetOk,
    PoolNode,
    PoolReleaseOk,
    PoolStatusReply,
)
from perseus_client.slurm_messages import (
    AdminSlurmEpilog,
    AdminSlurmProlog,
    SlurmJobEnergy,
    SlurmJobOk,
    SlurmJobsReply,
    SlurmJobsRequest,
)
from perseus_client.status_messages import (
    DaemonHealth,
    GpuStatus,
    LeaseInfo,
    PlanStats,
    PoolInfo,
    StatusReply,
    StatusRequest,
)
from perseus_client.validation import Schema
from perseus_client.version import PROTOCOL_MAJOR, PROTOCOL_MINOR, since

# Re-exported: one import for every message; job messages live in job_messages, the base in message.
__all__ = [
    "JOB_STATES",
    "AdminCapStatus",
    "AdminClearCap",
    "AdminPoolRelease",
    "AdminPoolSetBudget",
    "AdminPoolStatus",
    "AdminSetCap",
    "AdminSetJobPriority",
    "AdminSlurmEpilog",
    "AdminSlurmProlog",
    "AnnounceStraggler",
    "AnnounceStragglerOk",
    "CapGpu",
    "CapJob",
    "CapStatusReply",
    "CarbonInfo",
    "CarriedComputation",
    "Carry",
    "CarryReady",
    "DaemonHealth",
    "DocumentReply",
    "EnergyRead",
    "EnergyReading",
    "ErrorCode",
    "ErrorReply",
    "Frame",
    "FrontierRequest",
    "GpuEnergy",
    "GpuStatus",
    "Instruction",
    "JobInfo",
    "JobPriorityOk",
    "JobsReply",
    "JobsRequest",
    "LeaseInfo",
    "Message",
    "PipelineInfo",
    "PlanRequest",
    "PlanStats",
    "PlanningInfo",
    "Policy",
    "PoolBudgetOk",
    "PoolInfo",
    "PoolNode",
    "PoolReleaseOk",
    "PoolStatusReply",
    "ProfileExport",
    "ProfileImport",
    "ProfileImportOk",
    "ProfileReply",
    "ProfilingInfo",
    "ProtocolError",
    "Register",
    "RegisterOk",
    "Schedule",
    "SetPolicy",
    "SetPolicyOk",
    "SignalInfo",
    "SlurmJobEnergy",
    "SlurmJobOk",
    "SlurmJobsReply",
    "SlurmJobsRequest",
    "SpanInfo",
    "SpanMember",
    "StatusReply",
    "StatusRequest",
    "StragglerInfo",
]

PROTOCOL_VERSION = PROTOCOL_MAJOR
"""The frame's "v": the protocol's major (kept under its old name; see `perseus_client.version`)."""
__all__ += [
    "ADMIN_SOCKET_NAME",
    "CONTROL_SOCKET_NAME",
    "DEFAULT_MAX_FRAME_BYTES",
    "EVENT_SOCKET_NAME",
    "MAX_REQUEST_ID",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PUSH_TYPES",
    "SEQPACKET_EVENT_SOCKET_NAME",
    "since",
]


# --------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class GpuCapabilities:
    """What a client may ask of one GPU."""

    uuid: str
    name: str
    supported_sm_clocks_mhz: tuple[int, ...]
    power_limit_min_w: float
    power_limit_max_w: float
    power_limit_default_w: float
    energy_counter_supported: bool


@dataclass(frozen=True)
class Hello(JobMessage, wire_type="hello"):
    """Client -> daemon: register this process (identity comes from the kernel, never from here)."""

    client_version: str


@dataclass(frozen=True)
class HelloOk(Message, wire_type="hello_ok"):
    daemon_version: str
    protocol: int
    """The daemon's major (the only one it speaks)."""
    gpus: tuple[GpuCapabilities, ...]
    protocol_minor: int = since(1, 0)
    """The newest minor of `protocol` the daemon speaks (it speaks every older one too)."""
    visible_gpus: tuple[str, ...] | None = since(5, None)
    """The UUIDs of the GPUs this process may claim, in its own device order (index 0 first: what
    `CUDA_VISIBLE_DEVICES` indexes in its container); None: every GPU of `gpus`, in their order."""
    event_socket: str | None = since(10, None)
    """The name, in the runtime directory, of the daemon's SOCK_SEQPACKET event socket
    (`SEQPACKET_EVENT_SOCKET_NAME`); None: events go to the ZeroMQ event socket only."""


@dataclass(frozen=True)
class Claim(GpusMessage, wire_type="claim"):
    """Lease GPUs (by UUID) for this process; the original state is saved before any write."""

    job: str


@dataclass(frozen=True)
class ClaimOk(GpusMessage, wire_type="claim_ok"):
    """The GPUs now leased to this process."""


@dataclass(frozen=True)
class Release(GpusMessage, wire_type="release"):
    """Release leases (an empty tuple releases all of this process's leases); GPUs are restored."""


@dataclass(frozen=True)
class RestoreReply(GpusMessage):
    """GPUs put back as they were before any lease (`gpus`), and those whose restore failed (`failed`)."""

    failed: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseOk(RestoreReply, wire_type="release_ok"):
    """The leases released: GPUs restored, and those whose restore failed."""


@dataclass(frozen=True)
class SetClock(GpuMessage, wire_type="set_clock"):
    """Lock the SM clock of a leased GPU (None unlocks)."""

    sm_clock_mhz: int | None


@dataclass(frozen=True)
class SetClockOk(GpuMessage, wire_type="set_clock_ok"):
    applied_mhz: int | None


@dataclass(frozen=True)
class PlanEntry:
    """One computation of a plan: its clock (MHz). A plan lists a GPU's computations in schedule order."""

    instruction: Instruction
    microbatch: int
    chunk: int
    freq_mhz: int


@dataclass(frozen=True)
class SetPlan(GpuMessage, wire_type="set_plan"):
    """Deploy a per-computation clock plan on a leased GPU (replaces any plan it had)."""

    plan: tuple[PlanEntry, ...]


@dataclass(frozen=True)
class SetPlanOk(GpuMessage, wire_type="set_plan_ok"):
    computations: int


@dataclass(frozen=True)
class ClearPlan(GpuMessage, wire_type="clear_plan"):
    """Remove a leased GPU's plan; its clock stays as it is."""


@dataclass(frozen=True)
class ClearPlanOk(GpuMessage, wire_type="clear_plan_ok"):
    cleared: bool


@dataclass(frozen=True)
class AdminReset(GpusMessage, wire_type="admin_reset"):
    """Admin: restore saved originals, unlock clocks and drop leases (empty tuple: every GPU)."""


@dataclass(frozen=True)
class AdminResetOk(RestoreReply, wire_type="admin_reset_ok"):
    """The GPUs reset, and those whose restore or unlock failed."""


@dataclass(frozen=True)
class AdminSetPowerLimit(GpuMessage, wire_type="admin_set_power_limit"):
    power_limit_w: float


@dataclass(frozen=True)
class PowerLimitOk(GpuMessage, wire_type="power_limit_ok"):
    requested_w: float
    enforced_w: float


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


EVENT_TYPES: tuple[type[Message], ...] = (ComputationBegin, ComputationEnd, StepBegin, StepEnd)
STREAM_TYPES: tuple[type[Message], ...] = (EventsEnd, CarryReady)
"""Frames of the event socket that are not events (read in stream order, never counted as events)."""
PUSH_TYPES: tuple[type[Message], ...] = (Carry,)
"""Frames the daemon sends a client on its event connection unasked."""
REQUEST_TYPES: tuple[type[Message], ...] = (
    Hello,
    Claim,
    Release,
    SetClock,
    SetPlan,
    ClearPlan,
    StatusRequest,
    Register,
    SetPolicy,
    JobsRequest,
    FrontierRequest,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    AnnounceStraggler,
    EventCount,
    EnergyRead,
    SlurmJobsRequest,
    *EVENT_TYPES,
)
ADMIN_TYPES: tuple[type[Message], ...] = (
    AdminReset,
    AdminSetPowerLimit,
    StatusRequest,
    AdminPoolSetBudget,
    AdminPoolStatus,
    AdminPoolRelease,
    AdminSetCap,
    AdminClearCap,
    AdminCapStatus,
    AdminSetJobPriority,
    AdminSlurmProlog,
    AdminSlurmEpilog,
    SlurmJobsRequest,
)
REPLY_TYPES: tuple[type[Message], ...] = (
    HelloOk,
    ClaimOk,
    ReleaseOk,
    SetClockOk,
    SetPlanOk,
    ClearPlanOk,
    StatusReply,
    AdminResetOk,
    PowerLimitOk,
    EventAck,
    RegisterOk,
    SetPolicyOk,
    JobsReply,
    DocumentReply,
    ProfileReply,
    ProfileImportOk,
    AnnounceStragglerOk,
    EventCountOk,
    EnergyReading,
    PoolBudgetOk,
    PoolReleaseOk,
    PoolStatusReply,
    CapStatusReply,
    JobPriorityOk,
    SlurmJobsReply,
    SlurmJobOk,
    ErrorReply,
)
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (*REQUEST_TYPES, *ADMIN_TYPES, *REPLY_TYPES, *STREAM_TYPES, *PUSH_TYPES)
}


STRICT = Schema(strict=True, minor=PROTOCOL_MINOR)
TOLERANT = Schema(strict=False, minor=PROTOCOL_MINOR)


# --------------------------------------------------------------------------------------------- encoding


def encode(
    message: Message,
    request_id: int = 0,
    minor: int = PROTOCOL_MINOR,
    *,
    major: int = PROTOCOL_MAJOR,
    keep_newer_values: bool = False,
) -> bytes:
    """Encode a message as one compact, standard JSON frame in protocol `major`.`minor` (default: newest).

    Fields newer than `minor` are left out (with `keep_newer_values`, only those at their default). Raises
    ValueError when a number is NaN or infinite, or an event's field is not of its type: such a frame would
    be refused on the other side. Events are written by `perseus_client.event_frames`, as the client writes
    them.
    """
    if isinstance(message, ComputationBegin | ComputationEnd | StepBegin | StepEnd):
        return _encode_event(message, request_id, minor, major)
    return encode_frame(message, request_id, minor, major=major, keep_newer_values=keep_newer_values)


def _encode_event(
    message: ComputationBegin | ComputationEnd | StepBegin | StepEnd, request_id: int, minor: int, major: int
) -> bytes:
    writer = EventWriter(frame_head(major, request_id, minor))
    kind = message.TYPE.encode()
    if isinstance(message, StepBegin | StepEnd):
        _check_event(message.gpu, message.step, message.timestamp_ns)
        return writer.step(kind, message.gpu, message.step, message.timestamp_ns)
    numbers = (message.stage, message.microbatch, message.chunk, message.timestamp_ns)
    _check_event(message.gpu, *numbers)
    return writer.computation(kind, message.gpu, message.stage, message.instruction, *numbers[1:])


def _check_event(gpu: object, *numbers: object) -> None:
    """An event's GPU is a string and its numbers are integers (not bools), as the daemon decodes them."""
    if type(gpu) is not str or any(type(number) is not int for number in numbers):
        raise ValueError(f"an event's gpu is a string and its numbers integers (got {gpu!r}, {numbers!r})")


def decode(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, minor: int = PROTOCOL_MINOR) -> Frame:
    """Decode and strictly validate one request or event (the daemon's side); raises `ProtocolError`.

    Unknown types and fields are refused; so are types and fields newer than `minor` (a daemon speaking an
    older minor). Whatever the bytes, only `ProtocolError` comes out, carrying the frame's request id and
    major once known (`ProtocolError.request_id`, `frame_major`).
    """
    schema = STRICT if minor == PROTOCOL_MINOR else Schema(strict=True, minor=minor)
    return decode_frame(
        data, max_frame_bytes, MESSAGE_TYPES, schema=schema, peer="the client", we_are="perseusd"
    )


def decode_reply(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Frame:
    """Decode one reply (the client's side): fields this library does not know (a newer minor's) are
    ignored, fields it knows but the reply left out (an older minor's) take their defaults, and an error
    reply decodes whatever its major. Anything else malformed raises `ProtocolError`."""
    return decode_frame(
        data, max_frame_bytes, MESSAGE_TYPES, schema=TOLERANT, peer="perseusd", we_are="this client"
    )


def request_id_of(data: bytes) -> int:
    """Best-effort request id of a frame that failed to decode (0 when unknown), to address the error.

    Prefer `ProtocolError.request_id` from `decode`, which parses the frame only once.
    """
    try:
        decode(data, max(len(data), 1))
    except ProtocolError as exc:
        return exc.request_id
    except Exception:
        return _leading_id(data)
    return 0

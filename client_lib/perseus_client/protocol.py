"""The Perseus wire protocol, shared by the daemon and the client library (stdlib only).

Every frame is one compact JSON object: ``{"v": MAJOR, "id": REQUEST_ID, "m": MINOR, "type": TYPE, ...}``
(`perseus_client.envelope`; "m" is left out for minor 0). Requests on the control and admin sockets carry
an id (an int > 0) that the reply echoes; events on the event socket are fire-and-forget and carry id 0.
GPUs are named by UUID on the wire, never by index. The daemon decodes requests strictly (`decode`: unknown
types, missing or extra fields and wrong field types are rejected with a stable `ErrorCode`); the client
decodes replies tolerantly (`decode_reply`: fields it does not know are ignored, error replies decode
whatever their version). This module is the one import for the protocol: it owns the encoder and the
decoders and re-exports every message (each defined beside its kin: `lease_messages`, `clock_messages`,
`event_messages`, `job_messages`, ...) and the registries of message types (`perseus_client.message_types`).

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
from perseus_client.clock_messages import (
    AdminSetPowerLimit,
    ClearPlan,
    ClearPlanOk,
    PlanEntry,
    PowerLimitOk,
    SetClock,
    SetClockOk,
    SetPlan,
    SetPlanOk,
)
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
from perseus_client.event_messages import (
    ComputationBegin,
    ComputationEnd,
    ComputationEvent,
    EventAck,
    EventCount,
    EventCountOk,
    EventsEnd,
    StepBegin,
    StepEnd,
    StepEvent,
)
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
from perseus_client.lease_messages import (
    AdminReset,
    AdminResetOk,
    Claim,
    ClaimOk,
    GpuCapabilities,
    Hello,
    HelloOk,
    Release,
    ReleaseOk,
    RestoreReply,
)
from perseus_client.message import (
    JOB_STATES,
    ErrorReply,
    Instruction,
    Message,
    Policy,
    Schedule,
)
from perseus_client.message_types import (
    ADMIN_TYPES,
    EVENT_TYPES,
    MESSAGE_TYPES,
    PUSH_TYPES,
    REPLY_TYPES,
    REQUEST_TYPES,
    STREAM_TYPES,
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

# Re-exported: one import for the whole protocol. Each message lives beside its kin (lease_messages,
# event_messages, job_messages, ...), the base in message, the registries of types in message_types.
__all__ = [
    "JOB_STATES",
    "AdminCapStatus",
    "AdminClearCap",
    "AdminPoolRelease",
    "AdminPoolSetBudget",
    "AdminPoolStatus",
    "AdminReset",
    "AdminResetOk",
    "AdminSetCap",
    "AdminSetJobPriority",
    "AdminSetPowerLimit",
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
    "Claim",
    "ClaimOk",
    "ClearPlan",
    "ClearPlanOk",
    "ComputationBegin",
    "ComputationEnd",
    "ComputationEvent",
    "DaemonHealth",
    "DocumentReply",
    "EnergyRead",
    "EnergyReading",
    "ErrorCode",
    "ErrorReply",
    "EventAck",
    "EventCount",
    "EventCountOk",
    "EventsEnd",
    "Frame",
    "FrontierRequest",
    "GpuCapabilities",
    "GpuEnergy",
    "GpuStatus",
    "Hello",
    "HelloOk",
    "Instruction",
    "JobInfo",
    "JobPriorityOk",
    "JobsReply",
    "JobsRequest",
    "LeaseInfo",
    "Message",
    "PipelineInfo",
    "PlanEntry",
    "PlanRequest",
    "PlanStats",
    "PlanningInfo",
    "Policy",
    "PoolBudgetOk",
    "PoolInfo",
    "PoolNode",
    "PoolReleaseOk",
    "PoolStatusReply",
    "PowerLimitOk",
    "ProfileExport",
    "ProfileImport",
    "ProfileImportOk",
    "ProfileReply",
    "ProfilingInfo",
    "ProtocolError",
    "Register",
    "RegisterOk",
    "Release",
    "ReleaseOk",
    "RestoreReply",
    "Schedule",
    "SetClock",
    "SetClockOk",
    "SetPlan",
    "SetPlanOk",
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
    "StepBegin",
    "StepEnd",
    "StepEvent",
    "StragglerInfo",
]

PROTOCOL_VERSION = PROTOCOL_MAJOR
"""The frame's "v": the protocol's major (kept under its old name; see `perseus_client.version`)."""
__all__ += [
    "ADMIN_SOCKET_NAME",
    "ADMIN_TYPES",
    "CONTROL_SOCKET_NAME",
    "DEFAULT_MAX_FRAME_BYTES",
    "EVENT_SOCKET_NAME",
    "EVENT_TYPES",
    "MAX_REQUEST_ID",
    "MESSAGE_TYPES",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PUSH_TYPES",
    "REPLY_TYPES",
    "REQUEST_TYPES",
    "SEQPACKET_EVENT_SOCKET_NAME",
    "STREAM_TYPES",
    "since",
]


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

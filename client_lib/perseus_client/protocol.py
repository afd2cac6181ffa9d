"""The Perseus wire protocol, shared by the daemon and the client library (stdlib only).

Every frame is one compact JSON object: ``{"v": PROTOCOL_VERSION, "id": REQUEST_ID, "type": TYPE, ...}``.
Requests on the control and admin sockets carry an id (an int > 0) that the reply echoes; events on the
event socket are fire-and-forget and carry id 0. GPUs are named by UUID on the wire, never by index.
Decoding is strict: unknown types, missing or extra fields and wrong field types are rejected with a
stable `ErrorCode`.

The protocol version is separate from the package version: bump it on any incompatible change.
Version 2: `set_plan` / `clear_plan` requests and the `plan` field of a status GPU row.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal, TypeAlias

PROTOCOL_VERSION = 2
DEFAULT_MAX_FRAME_BYTES = 65536

CONTROL_SOCKET_NAME = "control.sock"
EVENT_SOCKET_NAME = "events.sock"
ADMIN_SOCKET_NAME = "admin.sock"

Instruction: TypeAlias = Literal["forward", "backward"]


class ErrorCode(StrEnum):
    """Stable error codes carried by `ErrorReply.code`. Never renumber or rename."""

    BAD_FRAME = "BAD_FRAME"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    BAD_FIELD = "BAD_FIELD"
    TOO_LARGE = "TOO_LARGE"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    NOT_REGISTERED = "NOT_REGISTERED"
    NOT_LEASED = "NOT_LEASED"
    OUT_OF_ORDER = "OUT_OF_ORDER"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    GPU_BUSY = "GPU_BUSY"
    UNKNOWN_GPU = "UNKNOWN_GPU"
    GPU_ERROR = "GPU_ERROR"
    INTERNAL = "INTERNAL"


class ProtocolError(Exception):
    """A frame or request was rejected; `code` is the stable code sent back in an `ErrorReply`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


# --------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    """Base of every message; `TYPE` is the wire `type`."""

    TYPE: ClassVar[str] = ""


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
class Hello(Message):
    """Client -> daemon: register this process (identity comes from the kernel, never from here)."""

    TYPE: ClassVar[str] = "hello"
    job: str
    client_version: str


@dataclass(frozen=True)
class HelloOk(Message):
    TYPE: ClassVar[str] = "hello_ok"
    daemon_version: str
    protocol: int
    gpus: tuple[GpuCapabilities, ...]


@dataclass(frozen=True)
class Claim(Message):
    """Lease GPUs (by UUID) for this process; the original state is saved before any write."""

    TYPE: ClassVar[str] = "claim"
    gpus: tuple[str, ...]
    job: str


@dataclass(frozen=True)
class ClaimOk(Message):
    TYPE: ClassVar[str] = "claim_ok"
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class Release(Message):
    """Release leases (an empty tuple releases all of this process's leases); GPUs are restored."""

    TYPE: ClassVar[str] = "release"
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseOk(Message):
    TYPE: ClassVar[str] = "release_ok"
    gpus: tuple[str, ...]
    failed: tuple[str, ...]


@dataclass(frozen=True)
class SetClock(Message):
    """Lock the SM clock of a leased GPU (None unlocks)."""

    TYPE: ClassVar[str] = "set_clock"
    gpu: str
    sm_clock_mhz: int | None


@dataclass(frozen=True)
class SetClockOk(Message):
    TYPE: ClassVar[str] = "set_clock_ok"
    gpu: str
    applied_mhz: int | None


@dataclass(frozen=True)
class PlanEntry:
    """One computation of a plan: its clock (MHz). A plan lists a GPU's computations in schedule order."""

    instruction: Instruction
    microbatch: int
    chunk: int
    freq_mhz: int


@dataclass(frozen=True)
class SetPlan(Message):
    """Deploy a per-computation clock plan on a leased GPU (replaces any plan it had)."""

    TYPE: ClassVar[str] = "set_plan"
    gpu: str
    plan: tuple[PlanEntry, ...]


@dataclass(frozen=True)
class SetPlanOk(Message):
    TYPE: ClassVar[str] = "set_plan_ok"
    gpu: str
    computations: int


@dataclass(frozen=True)
class ClearPlan(Message):
    """Remove a leased GPU's plan; its clock stays as it is."""

    TYPE: ClassVar[str] = "clear_plan"
    gpu: str


@dataclass(frozen=True)
class ClearPlanOk(Message):
    TYPE: ClassVar[str] = "clear_plan_ok"
    gpu: str
    cleared: bool


@dataclass(frozen=True)
class StatusRequest(Message):
    TYPE: ClassVar[str] = "status"


@dataclass(frozen=True)
class LeaseInfo:
    pid: int
    uid: int
    job: str


@dataclass(frozen=True)
class PlanStats:
    """Per-computation switching of one GPU's plan: counters and event -> clock applied latency (ms)."""

    computations: int
    clock_changes: int
    skipped: int
    late: int
    unplanned: int
    errors: int
    event_to_clock_p50_ms: float | None
    event_to_clock_p99_ms: float | None


@dataclass(frozen=True)
class GpuStatus:
    """One GPU row of a status reply; None means unavailable. `error` set: the GPU failed to answer."""

    uuid: str
    name: str
    sm_clock_mhz: int | None
    locked_clock_mhz: int | None
    power_w: float | None
    power_limit_w: float | None
    energy_j: float | None
    lease: LeaseInfo | None
    error: str | None
    call_ms: dict[str, float]
    plan: PlanStats | None = None


@dataclass(frozen=True)
class DaemonHealth:
    version: str
    protocol: int
    pid: int
    uptime_s: float
    clients: int
    events_received: int
    events_dropped: int
    errors_by_code: dict[str, int]
    restores: int
    restore_failures: int
    last_restore_s: float | None
    auth_rejected: int


@dataclass(frozen=True)
class StatusReply(Message):
    TYPE: ClassVar[str] = "status_ok"
    daemon: DaemonHealth
    gpus: tuple[GpuStatus, ...]


@dataclass(frozen=True)
class AdminReset(Message):
    """Admin: restore saved originals, unlock clocks and drop leases (empty tuple: every GPU)."""

    TYPE: ClassVar[str] = "admin_reset"
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class AdminResetOk(Message):
    TYPE: ClassVar[str] = "admin_reset_ok"
    gpus: tuple[str, ...]
    failed: tuple[str, ...]


@dataclass(frozen=True)
class AdminSetPowerLimit(Message):
    TYPE: ClassVar[str] = "admin_set_power_limit"
    gpu: str
    power_limit_w: float


@dataclass(frozen=True)
class PowerLimitOk(Message):
    TYPE: ClassVar[str] = "power_limit_ok"
    gpu: str
    requested_w: float
    enforced_w: float


@dataclass(frozen=True)
class ComputationBegin(Message):
    """Event: a computation starts on a leased GPU. `timestamp_ns` is the client's `time.time_ns()`."""

    TYPE: ClassVar[str] = "comp_begin"
    gpu: str
    stage: int
    instruction: Instruction
    microbatch: int
    chunk: int
    timestamp_ns: int


@dataclass(frozen=True)
class ComputationEnd(Message):
    TYPE: ClassVar[str] = "comp_end"
    gpu: str
    stage: int
    instruction: Instruction
    microbatch: int
    chunk: int
    timestamp_ns: int


@dataclass(frozen=True)
class StepBegin(Message):
    TYPE: ClassVar[str] = "step_begin"
    gpu: str
    step: int
    timestamp_ns: int


@dataclass(frozen=True)
class StepEnd(Message):
    TYPE: ClassVar[str] = "step_end"
    gpu: str
    step: int
    timestamp_ns: int


@dataclass(frozen=True)
class EventAck(Message):
    """Reply to an event sent on the control socket (events on the event socket get no reply)."""

    TYPE: ClassVar[str] = "event_ack"


@dataclass(frozen=True)
class ErrorReply(Message):
    TYPE: ClassVar[str] = "error"
    code: str
    message: str


EVENT_TYPES: tuple[type[Message], ...] = (ComputationBegin, ComputationEnd, StepBegin, StepEnd)
REQUEST_TYPES: tuple[type[Message], ...] = (
    Hello,
    Claim,
    Release,
    SetClock,
    SetPlan,
    ClearPlan,
    StatusRequest,
    *EVENT_TYPES,
)
ADMIN_TYPES: tuple[type[Message], ...] = (AdminReset, AdminSetPowerLimit, StatusRequest)
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
    ErrorReply,
)
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (*REQUEST_TYPES, *ADMIN_TYPES, *REPLY_TYPES)
}


@dataclass(frozen=True)
class Frame:
    """A decoded frame: the request id and the typed message."""

    request_id: int
    message: Message


# --------------------------------------------------------------------------------------------- encoding


def encode(message: Message, request_id: int = 0) -> bytes:
    """Encode a message as one compact JSON frame."""
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "type": message.TYPE}
    body.update(dataclasses.asdict(message))
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Frame:
    """Decode and strictly validate one frame; raises `ProtocolError` with a stable code."""
    if len(data) > max_frame_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {len(data)} bytes exceeds {max_frame_bytes}")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"not a JSON frame: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, "frame is not a JSON object")
    version = body.pop("v", None)
    if type(version) is not int:
        raise ProtocolError(ErrorCode.BAD_FRAME, "missing protocol version 'v'")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH, f"protocol {version} not supported (daemon speaks {PROTOCOL_VERSION})"
        )
    request_id = body.pop("id", None)
    if type(request_id) is not int or request_id < 0:
        raise ProtocolError(ErrorCode.BAD_FRAME, "missing or bad request id 'id'")
    msg_type = body.pop("type", None)
    cls = MESSAGE_TYPES.get(msg_type) if isinstance(msg_type, str) else None
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {msg_type!r}")
    return Frame(request_id, _build(cls, body, msg_type or ""))


def request_id_of(data: bytes) -> int:
    """Best-effort request id of a frame that failed to decode (0 when unknown), to address the error."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return 0
    rid = body.get("id") if isinstance(body, dict) else None
    return rid if type(rid) is int and rid >= 0 else 0


# --------------------------------------------------------------------------------------------- validation

_Checker = typing.Callable[[Any, str], Any]
_FIELD_CACHE: dict[type, tuple[tuple[str, _Checker], ...]] = {}


def _build(cls: type[Any], body: dict[str, Any], where: str) -> Any:
    fields = _fields_of(cls)
    names = {name for name, _ in fields}
    extra = set(body) - names
    if extra:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: unexpected field(s) {sorted(extra)}")
    kwargs: dict[str, Any] = {}
    for name, check in fields:
        if name not in body:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: missing field '{name}'")
        kwargs[name] = check(body[name], f"{where}.{name}")
    return cls(**kwargs)


def _fields_of(cls: type[Any]) -> tuple[tuple[str, _Checker], ...]:
    cached = _FIELD_CACHE.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = tuple((f.name, _checker_for(hints[f.name])) for f in dataclasses.fields(cls))
        _FIELD_CACHE[cls] = cached
    return cached


def _bad(where: str, expected: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_FIELD, f"{where}: expected {expected}")


def _checker_for(hint: Any) -> _Checker:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is int:
        return _check_int
    if hint is float:
        return _check_float
    if hint is str:
        return _check_str
    if hint is bool:
        return _check_bool
    if origin is Literal:
        return _literal_checker(args)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional_checker(_checker_for(inner))
    if origin is tuple:
        return _tuple_checker(_checker_for(args[0]))
    if origin is dict:
        return _dict_checker(_checker_for(args[1]))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        cls: type[Any] = hint
        return lambda value, where: _check_object(cls, value, where)
    raise TypeError(f"unsupported protocol field type {hint!r}")


def _check_int(value: Any, where: str) -> int:
    if type(value) is not int:
        raise _bad(where, "an integer")
    return value


def _check_float(value: Any, where: str) -> float:
    if type(value) not in (int, float):
        raise _bad(where, "a number")
    return float(value)


def _check_str(value: Any, where: str) -> str:
    if type(value) is not str:
        raise _bad(where, "a string")
    return value


def _check_bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise _bad(where, "a boolean")
    return value


def _check_object(cls: type[Any], value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _bad(where, "an object")
    return _build(cls, dict(value), where)


def _literal_checker(allowed: tuple[Any, ...]) -> _Checker:
    def check(value: Any, where: str) -> Any:
        if value not in allowed or type(value) is not str:
            raise _bad(where, f"one of {list(allowed)}")
        return value

    return check


def _optional_checker(inner: _Checker) -> _Checker:
    return lambda value, where: None if value is None else inner(value, where)


def _tuple_checker(inner: _Checker) -> _Checker:
    def check(value: Any, where: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _bad(where, "a list")
        return tuple(inner(item, f"{where}[{i}]") for i, item in enumerate(value))

    return check


def _dict_checker(inner: _Checker) -> _Checker:
    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _bad(where, "an object")
        return {str(k): inner(v, f"{where}.{k}") for k, v in value.items()}

    return check

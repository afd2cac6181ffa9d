"""Domain errors as the wire shows them: the one table from an exception to its error code.

Libraries below the daemon raise domain errors (`perseusd.errors`) and know nothing of the wire. The core's
request dispatch (`DaemonCore.handle`) turns every request's domain error into its wire error through
`protocol_error`, naming where in the request a refusal's problem is (`set_plan.plan[3].freq_mhz: ...`), and
the IPC layer uses it for whatever else reaches it (an event's), so a domain error reads the same whichever
request met it. An error not in the table is an internal one.
"""

from __future__ import annotations

from perseus_client.protocol import ErrorCode, ProtocolError

from perseusd import errors
from perseusd.gpu.registry import UnknownGpuError
from perseusd.leasing.state_file import StateWriteError

CODES: tuple[tuple[type[errors.PerseusError], ErrorCode], ...] = (
    (errors.InvalidValueError, ErrorCode.BAD_FIELD),
    (errors.NotPermittedError, ErrorCode.PERMISSION_DENIED),
    (errors.LimitReachedError, ErrorCode.LIMIT),
    (errors.NotRegisteredError, ErrorCode.NOT_REGISTERED),
    (errors.GpuBusyError, ErrorCode.GPU_BUSY),
    (errors.NotLeasedError, ErrorCode.NOT_LEASED),
    (errors.InconsistentStateError, ErrorCode.INTERNAL),
    (errors.JobNotFoundError, ErrorCode.BAD_FIELD),
    (errors.JobOwnerError, ErrorCode.PERMISSION_DENIED),
    (StateWriteError, ErrorCode.STATE_WRITE_FAILED),
    (UnknownGpuError, ErrorCode.UNKNOWN_GPU),  # before GpuError, its base
    (errors.GpuError, ErrorCode.GPU_ERROR),
)
"""First match wins: a subclass comes before its base."""


def protocol_error(exc: errors.PerseusError, request: str = "") -> ProtocolError | None:
    """The wire error for a domain error met serving a request of type `request` ("": none, an event's), or
    None for one the table does not name (an internal error)."""
    for kind, code in CODES:
        if isinstance(exc, kind):
            return ProtocolError(code, _message(exc, request))
    return None


def _message(exc: errors.PerseusError, request: str) -> str:
    if isinstance(exc, errors.RefusedError):
        return exc.located(request)
    if isinstance(exc, StateWriteError):
        return (
            f"{exc}; the request was not applied (the daemon keeps serving; retry when the state directory "
            "is writable again)"
        )
    return str(exc)

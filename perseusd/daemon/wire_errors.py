"""Domain errors as the wire shows them: the one table from an exception to its error code.

The core's request dispatch (`DaemonCore.handle`) raises every request's domain error through
`protocol_error`, and the IPC layer uses it for whatever else reaches it (an event's), so a domain error reads
the same whichever request met it. An error not in the table is an internal one.
"""

from __future__ import annotations

from perseus_client.protocol import ErrorCode, ProtocolError

from perseusd.errors import GpuError, JobNotFoundError, JobOwnerError, PerseusError
from perseusd.gpu.registry import UnknownGpuError
from perseusd.leasing.state_file import StateWriteError

CODES: tuple[tuple[type[PerseusError], ErrorCode], ...] = (
    (JobNotFoundError, ErrorCode.BAD_FIELD),
    (JobOwnerError, ErrorCode.PERMISSION_DENIED),
    (StateWriteError, ErrorCode.STATE_WRITE_FAILED),
    (UnknownGpuError, ErrorCode.UNKNOWN_GPU),  # before GpuError, its base
    (GpuError, ErrorCode.GPU_ERROR),
)
"""First match wins: a subclass comes before its base."""


def protocol_error(exc: PerseusError) -> ProtocolError | None:
    """The wire error for a domain error, or None for one the table does not name (an internal error)."""
    for kind, code in CODES:
        if isinstance(exc, kind):
            return ProtocolError(code, _message(exc))
    return None


def _message(exc: PerseusError) -> str:
    if isinstance(exc, StateWriteError):
        return (
            f"{exc}; the request was not applied (the daemon keeps serving; retry when the state directory "
            "is writable again)"
        )
    return str(exc)

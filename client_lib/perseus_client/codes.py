"""Stable error codes of the wire protocol and the exception that carries them (stdlib only)."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10: the client library supports it (training images such as NGC 24.x run it)

    class StrEnum(str, Enum):
        """`enum.StrEnum` of Python 3.11: members are strings, and print as their value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


class JobState(StrEnum):
    """A job's state, as `JobInfo.state` and `RegisterOk.state` carry it (the daemon's moves between them:
    `perseusd/jobs/states.py`). Never rename a value: clients compare these strings."""

    REGISTERED = "registered"
    PROFILING = "profiling"
    SOLVING = "solving"
    RUNNING = "running"
    ENDED = "ended"
    FAILED = "failed"


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
    STATE_WRITE_FAILED = "STATE_WRITE_FAILED"
    LIMIT = "LIMIT"
    """A per-user or daemon-wide limit (registered processes, connections, descriptors) was reached."""


class ProtocolError(Exception):
    """A frame or request was rejected; `code` is the stable code sent back in an `ErrorReply`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = 0
        """The request id of the frame that was rejected, once the decoder knew it (0: unknown)."""
        self.frame_major: int | None = None
        """The major (`"v"`) of the frame that was rejected, once the decoder knew it: the error reply is
        written in it, so that the sender can read it whatever its version."""

"""Typed GPU errors, all under `perseusd.errors.GpuError`.

Each error carries the GPU's UUID where known, the operation that failed and, for NVML, the raw return code.
Messages say what went wrong and what to do next.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import ClassVar

from perseusd.errors import GpuError


@dataclass(eq=False, repr=False)  # compared and shown as exceptions are
class GpuOperationError(GpuError):
    """A GPU operation failed. Base of the typed GPU errors below."""

    detail: str
    _: KW_ONLY
    uuid: str | None = None
    op: str | None = None
    nvml_code: int | None = None

    hint: ClassVar[str] = ""
    """What the operator should do next; appended to the message."""

    def __post_init__(self) -> None:
        super().__init__(self._message())

    def _message(self) -> str:
        where = []
        if self.op:
            where.append(self.op)
        if self.uuid:
            where.append(f"on GPU {self.uuid}")
        text = f"{' '.join(where)}: {self.detail}" if where else self.detail
        return f"{text}; {self.hint}" if self.hint else text


class GpuNotSupportedError(GpuOperationError):
    """The GPU or driver does not support the operation."""

    hint = "this GPU or driver does not support it"


class GpuPermissionError(GpuOperationError):
    """The caller lacks the privileges the operation needs."""

    hint = "run perseusd as root or grant CAP_SYS_ADMIN"


class GpuLostError(GpuOperationError):
    """The GPU fell off the bus or cannot be found any more."""

    hint = "the GPU is lost; check the driver log (dmesg) and reset or reboot the node"


class GpuResetRequiredError(GpuOperationError):
    """The GPU needs a reset before it can be used again."""

    hint = "reset the GPU (nvidia-smi --gpu-reset) or reboot the node"


class GpuTimeoutError(GpuOperationError):
    """The operation timed out in the driver."""

    hint = "the driver did not answer in time; retry, and check the driver log if it persists"


class NvmlLibraryError(GpuOperationError):
    """NVML (the library, the driver, or the `pynvml` module) is missing or unusable."""

    hint = (
        "install the NVIDIA driver and nvidia-ml-py (pip install 'perseusd[nvml]'), "
        "or run perseusd --backend sim"
    )


class GpuInvalidArgumentError(GpuOperationError):
    """The request was rejected as invalid (a clock or limit outside the supported range, ...)."""

    hint = "check the requested value against the GPU's supported range"


class GpuUnknownError(GpuOperationError):
    """Any other GPU failure."""

    hint = "see the daemon log for details"


class GpuOwnerStoppedError(GpuOperationError):
    """A command was sent to a GPU owner thread that is stopped."""

    hint = "the daemon is shutting down or the GPU thread has stopped"


ERROR_KINDS: dict[str, type[GpuOperationError]] = {
    "not_supported": GpuNotSupportedError,
    "no_permission": GpuPermissionError,
    "lost": GpuLostError,
    "reset_required": GpuResetRequiredError,
    "timeout": GpuTimeoutError,
    "library": NvmlLibraryError,
    "invalid_argument": GpuInvalidArgumentError,
    "unknown": GpuUnknownError,
}
"""Short names of the typed errors, as used by sim fault injection (`PERSEUSD_SIM_FAULTS`)."""

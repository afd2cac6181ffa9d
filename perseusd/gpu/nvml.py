"""The NVML backend: real NVIDIA GPUs through `pynvml` (NVIDIA's `nvidia-ml-py`).

This is the only module of Perseus that imports `pynvml`, and it does so lazily in `NvmlBackend.__init__`,
so the rest of the package imports on machines without the driver. Every NVML error is translated, through the
one table `NVML_ERROR_TABLE`, into a typed `perseusd.gpu.errors` exception naming the GPU and the operation.

NVML has no getter for the locked SM clock on every GPU, so the backend tracks the clock it locked itself; a
clock locked by an earlier process is not visible here (the daemon's state files cover that case).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from perseusd.gpu.backend import GpuBackend, GpuDevice, GpuInfo
from perseusd.gpu.clocks import clamp, snap_clock_mhz
from perseusd.gpu.errors import (
    GpuInvalidArgumentError,
    GpuLostError,
    GpuNotSupportedError,
    GpuOperationError,
    GpuPermissionError,
    GpuResetRequiredError,
    GpuTimeoutError,
    GpuUnknownError,
    NvmlLibraryError,
)
from perseusd.gpu.power_features import PowerFeature, nvml_power_features

logger = logging.getLogger(__name__)

T = TypeVar("T")

NVML_ERROR_TABLE: dict[str, type[GpuOperationError]] = {
    "NVML_ERROR_UNINITIALIZED": NvmlLibraryError,
    "NVML_ERROR_INVALID_ARGUMENT": GpuInvalidArgumentError,
    "NVML_ERROR_NOT_SUPPORTED": GpuNotSupportedError,
    "NVML_ERROR_NO_PERMISSION": GpuPermissionError,
    "NVML_ERROR_ALREADY_INITIALIZED": GpuUnknownError,
    "NVML_ERROR_NOT_FOUND": GpuLostError,
    "NVML_ERROR_INSUFFICIENT_SIZE": GpuUnknownError,
    "NVML_ERROR_INSUFFICIENT_POWER": GpuUnknownError,
    "NVML_ERROR_DRIVER_NOT_LOADED": NvmlLibraryError,
    "NVML_ERROR_TIMEOUT": GpuTimeoutError,
    "NVML_ERROR_IRQ_ISSUE": GpuUnknownError,
    "NVML_ERROR_LIBRARY_NOT_FOUND": NvmlLibraryError,
    "NVML_ERROR_FUNCTION_NOT_FOUND": GpuNotSupportedError,
    "NVML_ERROR_CORRUPTED_INFOROM": GpuResetRequiredError,
    "NVML_ERROR_GPU_IS_LOST": GpuLostError,
    "NVML_ERROR_RESET_REQUIRED": GpuResetRequiredError,
    "NVML_ERROR_OPERATING_SYSTEM": GpuPermissionError,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": NvmlLibraryError,
    "NVML_ERROR_IN_USE": GpuUnknownError,
    "NVML_ERROR_MEMORY": GpuUnknownError,
    "NVML_ERROR_NO_DATA": GpuUnknownError,
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": GpuNotSupportedError,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": GpuUnknownError,
    "NVML_ERROR_FREQ_NOT_SUPPORTED": GpuInvalidArgumentError,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": NvmlLibraryError,
    "NVML_ERROR_DEPRECATED": GpuNotSupportedError,
    "NVML_ERROR_NOT_READY": GpuTimeoutError,
    "NVML_ERROR_GPU_NOT_FOUND": GpuLostError,
    "NVML_ERROR_INVALID_STATE": GpuResetRequiredError,
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": GpuNotSupportedError,
    "NVML_ERROR_UNKNOWN": GpuUnknownError,
}
"""Every NVML return code (by its `pynvml` constant name) -> the typed exception raised for it.
Codes missing here (newer drivers) become `GpuUnknownError`."""


class NvmlErrors:
    """Translates `pynvml.NVMLError` into typed exceptions, using `NVML_ERROR_TABLE`."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml_error: type[Exception] = nvml.NVMLError
        self._by_code: dict[int, type[GpuOperationError]] = {
            getattr(nvml, name): cls for name, cls in NVML_ERROR_TABLE.items() if hasattr(nvml, name)
        }

    def translate(self, error: Exception, *, op: str, uuid: str | None) -> GpuOperationError:
        """The typed exception for an NVML error raised by `op`."""
        code: int | None = getattr(error, "value", None)
        cls = self._by_code.get(code, GpuUnknownError) if code is not None else GpuUnknownError
        return cls(f"NVML error {code}: {error}", uuid=uuid, op=op, nvml_code=code)

    def call(self, op: str, uuid: str | None, fn: Callable[..., T], *args: Any) -> T:
        """Call an NVML function, raising a typed exception on an NVML error."""
        try:
            return fn(*args)
        except self._nvml_error as error:
            raise self.translate(error, op=op, uuid=uuid) from error


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlDevice(GpuDevice):
    """One NVIDIA GPU. Not thread-safe: use it from one owner thread."""

    def __init__(self, nvml: ModuleType, errors: NvmlErrors, handle: object, info: GpuInfo) -> None:
        self._nvml = nvml
        self._errors = errors
        self._handle = handle
        self._info = info
        self._locked_mhz: int | None = None
        self._instant_power_supported = hasattr(nvml, "NVML_FI_DEV_POWER_INSTANT")

    def _call(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        return self._errors.call(op, self._info.uuid, fn, self._handle, *args)

    @property
    def info(self) -> GpuInfo:
        return self._info

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        op = "set_locked_sm_clock_mhz"
        if not self._info.supported_sm_clocks_mhz:
            raise GpuNotSupportedError("no supported SM clocks reported", uuid=self._info.uuid, op=op)
        applied_mhz = snap_clock_mhz(self._info.supported_sm_clocks_mhz, clock_mhz)
        self._call(op, self._nvml.nvmlDeviceSetGpuLockedClocks, applied_mhz, applied_mhz)
        self._locked_mhz = applied_mhz
        return applied_mhz

    def reset_locked_sm_clock(self) -> None:
        self._call("reset_locked_sm_clock", self._nvml.nvmlDeviceResetGpuLockedClocks)
        self._locked_mhz = None

    def locked_sm_clock_mhz(self) -> int | None:
        return self._locked_mhz

    def sm_clock_mhz(self) -> int:
        return int(self._call("sm_clock_mhz", self._nvml.nvmlDeviceGetClockInfo, self._nvml.NVML_CLOCK_SM))

    def power_features(self) -> tuple[PowerFeature, ...]:
        return nvml_power_features(self._nvml, self._errors, self._info.uuid, self._handle)

    def clock_event_reasons(self) -> int:
        """`nvmlDeviceGetCurrentClocksEventReasons` (the throttle reasons of older drivers' bindings)."""
        getter = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is None:
            getter = self._nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call("clock_event_reasons", getter))

    def set_power_limit_w(self, limit_w: float) -> float:
        info = self._info
        target_w = clamp(limit_w, info.power_limit_min_w, info.power_limit_max_w)
        self._call("set_power_limit_w", self._nvml.nvmlDeviceSetPowerManagementLimit, round(target_w * 1000))
        return self.power_limit_w()

    def power_limit_w(self) -> float:
        return float(self._call("power_limit_w", self._nvml.nvmlDeviceGetEnforcedPowerLimit)) / 1000.0

    def energy_mj(self) -> int:
        return int(self._call("energy_mj", self._nvml.nvmlDeviceGetTotalEnergyConsumption))

    def power_w(self) -> float:
        if self._instant_power_supported:
            instant_w = self._instant_power_w()
            if instant_w is not None:
                return instant_w
        return float(self._call("power_w", self._nvml.nvmlDeviceGetPowerUsage)) / 1000.0

    def _instant_power_w(self) -> float | None:
        """The POWER_INSTANT field (W), or None (and never asked again) when the GPU lacks it."""
        nvml = self._nvml
        try:
            values = self._call("power_w", nvml.nvmlDeviceGetFieldValues, [nvml.NVML_FI_DEV_POWER_INSTANT])
        except GpuNotSupportedError:
            self._instant_power_supported = False
            return None
        value = values[0]
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            self._instant_power_supported = False
            return None
        return float(value.value.uiVal) / 1000.0


def _supported_clocks_mhz(nvml: ModuleType, errors: NvmlErrors, uuid: str, handle: object) -> tuple[int, ...]:
    """Graphics clocks supported at the highest memory clock, highest first; () when not reported."""
    op = "supported_sm_clocks_mhz"
    try:
        memory_mhz = errors.call(op, uuid, nvml.nvmlDeviceGetSupportedMemoryClocks, handle)
        if not memory_mhz:
            return ()
        clocks = errors.call(op, uuid, nvml.nvmlDeviceGetSupportedGraphicsClocks, handle, max(memory_mhz))
    except GpuNotSupportedError:
        logger.warning("GPU %s does not report its supported clocks; clock locking is disabled", uuid)
        return ()
    return tuple(sorted({int(c) for c in clocks}, reverse=True))


def _power_limits_w(
    nvml: ModuleType, errors: NvmlErrors, uuid: str, handle: object
) -> tuple[float, float, float]:
    """(min, max, default) power limit (W); the enforced limit for all three without constraints."""
    op = "power_limit_constraints"
    try:
        low_mw, high_mw = errors.call(op, uuid, nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        default_mw = errors.call(op, uuid, nvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)
    except GpuNotSupportedError:
        enforced_w = float(errors.call(op, uuid, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)) / 1000.0
        return enforced_w, enforced_w, enforced_w
    return float(low_mw) / 1000.0, float(high_mw) / 1000.0, float(default_mw) / 1000.0


def _energy_supported(nvml: ModuleType, errors: NvmlErrors, uuid: str, handle: object) -> bool:
    try:
        errors.call("energy_mj", uuid, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    except GpuNotSupportedError:
        return False
    return True


def _minor_number(nvml: ModuleType, errors: NvmlErrors, uuid: str, handle: object) -> int | None:
    """The minor of the GPU's /dev/nvidia<N> node (None where NVML does not say: then its index)."""
    getter = getattr(nvml, "nvmlDeviceGetMinorNumber", None)
    if getter is None:
        return None
    try:
        return int(errors.call("enumerate", uuid, getter, handle))
    except GpuOperationError:
        return None


def _probe_device(nvml: ModuleType, errors: NvmlErrors, index: int) -> NvmlDevice:
    handle = errors.call("enumerate", None, nvml.nvmlDeviceGetHandleByIndex, index)
    uuid = _text(errors.call("enumerate", None, nvml.nvmlDeviceGetUUID, handle))
    name = _text(errors.call("enumerate", uuid, nvml.nvmlDeviceGetName, handle))
    pci = errors.call("enumerate", uuid, nvml.nvmlDeviceGetPciInfo, handle)
    low_w, high_w, default_w = _power_limits_w(nvml, errors, uuid, handle)
    info = GpuInfo(
        uuid=uuid,
        index=index,
        name=name,
        pci_bus_id=_text(pci.busId),
        supported_sm_clocks_mhz=_supported_clocks_mhz(nvml, errors, uuid, handle),
        power_limit_min_w=low_w,
        power_limit_max_w=high_w,
        power_limit_default_w=default_w,
        energy_counter_supported=_energy_supported(nvml, errors, uuid, handle),
        device_minor=_minor_number(nvml, errors, uuid, handle),
    )
    return NvmlDevice(nvml, errors, handle, info)


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as error:
        raise NvmlLibraryError(f"cannot import pynvml ({error})", op="nvml_init") from error
    module: ModuleType = pynvml
    return module


class NvmlBackend(GpuBackend):
    """All NVIDIA GPUs of the node, enumerated once by UUID.

    A GPU that fails during enumeration is left out (logged, and kept in `enumeration_errors`); a failure of
    NVML itself raises `NvmlLibraryError` (or the typed error of its code).
    """

    def __init__(self) -> None:
        nvml = _import_pynvml()
        self._nvml = nvml
        self._errors = NvmlErrors(nvml)
        self._errors.call("nvml_init", None, nvml.nvmlInit)
        self._closed = False
        self.enumeration_errors: list[GpuOperationError] = []
        self._devices = self._enumerate()

    def _enumerate(self) -> list[NvmlDevice]:
        count = int(self._errors.call("enumerate", None, self._nvml.nvmlDeviceGetCount))
        devices = []
        for index in range(count):
            try:
                devices.append(_probe_device(self._nvml, self._errors, index))
            except GpuOperationError as error:
                logger.warning("GPU %d left out: %s", index, error)
                self.enumeration_errors.append(error)
        return devices

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._errors.call("nvml_shutdown", None, self._nvml.nvmlShutdown)

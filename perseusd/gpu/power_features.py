"""The driver's power features that can fight the daemon's clocks, as NVML reports them.

- A **workload power profile** (NVML 570+, `nvmlDeviceWorkloadPowerProfileGetCurrentProfiles`): a profile the
  driver enforces (e.g. MAX_P, MAX_Q) retunes clocks and power on its own.
- **Power smoothing** (NVML 570+, field values `NVML_FI_PWR_SMOOTHING_*`, on GPUs that have it): a power floor
  and ramp limits hold the GPU's draw up (or its changes slow) whatever clock is locked.

Each is reported as active, inactive, "not supported" (the driver or this GPU has no such feature: NVML
answers NOT_SUPPORTED, as on an H100 with driver 570 and older) or "not exposed" (the installed nvidia-ml-py
has no call for it). The daemon reads them at start, logs a warning for every active one, shows them in
`status` and the metrics; the simulated boards have none. Reading only: the daemon never changes them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from perseusd.gpu.errors import GpuNotSupportedError, GpuOperationError

WORKLOAD_PROFILE = "workload_power_profile"
POWER_SMOOTHING = "power_smoothing"
STATES = ("active", "inactive", "not supported", "not exposed", "unknown")


@dataclass(frozen=True)
class PowerFeature:
    """One driver power feature of a GPU."""

    name: str
    state: str
    """One of `STATES`."""
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.state == "active"

    def text(self) -> str:
        return f"{self.name.replace('_', ' ')}: {self.state}" + (f" ({self.detail})" if self.detail else "")


class _Calls(Protocol):
    def call(self, op: str, uuid: str | None, fn: Any, *args: Any) -> Any: ...


def nvml_power_features(
    nvml: ModuleType, errors: _Calls, uuid: str, handle: object
) -> tuple[PowerFeature, ...]:
    """Both features of one GPU (never raises: a failure is the feature's "unknown" state)."""
    return (_workload_profile(nvml, errors, uuid, handle), _power_smoothing(nvml, errors, uuid, handle))


def _workload_profile(nvml: ModuleType, errors: _Calls, uuid: str, handle: object) -> PowerFeature:
    getter = getattr(nvml, "nvmlDeviceWorkloadPowerProfileGetCurrentProfiles", None)
    struct = getattr(nvml, "c_nvmlWorkloadPowerProfileCurrentProfiles_v1_t", None)
    if getter is None or struct is None:
        return PowerFeature(WORKLOAD_PROFILE, "not exposed", "nvidia-ml-py has no call for it")
    profiles = struct()
    profiles.version = getattr(nvml, "nvmlWorkloadPowerProfileCurrentProfiles_v1", 0)
    try:
        errors.call("workload_power_profile", uuid, getter, handle, ctypes.byref(profiles))
    except GpuNotSupportedError:
        return PowerFeature(WORKLOAD_PROFILE, "not supported")
    except GpuOperationError as exc:
        return PowerFeature(WORKLOAD_PROFILE, "unknown", str(exc))
    enforced = _mask_bits(profiles.enforcedProfilesMask)
    if not enforced:
        return PowerFeature(WORKLOAD_PROFILE, "inactive")
    return PowerFeature(WORKLOAD_PROFILE, "active", "enforced profile(s) " + ",".join(map(str, enforced)))


def _mask_bits(mask: Any) -> list[int]:
    words = list(getattr(mask, "mask", []))
    return [32 * w + b for w, word in enumerate(words) for b in range(32) if int(word) >> b & 1]


def _power_smoothing(nvml: ModuleType, errors: _Calls, uuid: str, handle: object) -> PowerFeature:
    names = ("NVML_FI_PWR_SMOOTHING_ENABLED", "NVML_FI_PWR_SMOOTHING_PRIMARY_POWER_FLOOR")
    field_ids = [getattr(nvml, name, None) for name in names]
    getter = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    if getter is None or None in field_ids:
        return PowerFeature(POWER_SMOOTHING, "not exposed", "nvidia-ml-py has no field for it")
    try:
        values = errors.call("power_smoothing", uuid, getter, handle, field_ids)
    except GpuNotSupportedError:
        return PowerFeature(POWER_SMOOTHING, "not supported")
    except GpuOperationError as exc:
        return PowerFeature(POWER_SMOOTHING, "unknown", str(exc))
    enabled, floor = values[0], values[1]
    if int(enabled.nvmlReturn) != 0:
        return PowerFeature(POWER_SMOOTHING, "not supported")
    if not int(enabled.value.uiVal):
        return PowerFeature(POWER_SMOOTHING, "inactive")
    detail = f"primary power floor {int(floor.value.uiVal)} W" if int(floor.nvmlReturn) == 0 else ""
    return PowerFeature(POWER_SMOOTHING, "active", detail)

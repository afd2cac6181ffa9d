"""A scripted fake `pynvml` module: GPUs as plain state, every call recorded, errors injected by NVML code."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ERROR_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_UNKNOWN": 999,
}


@dataclass
class FakeGpu:
    """One GPU's state, by what NVML reports of it: identity, clocks, power, energy."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    bus_id: bytes = b"00000000:07:00.0"
    graphics_clocks_by_memory_mhz: dict[int, list[int]] = field(
        default_factory=lambda: {1593: list(range(1410, 209, -15)), 405: [1411, 397]}
    )
    sm_clock_mhz: int = 1410
    clock_event_reasons: int = 0
    power_limits_mw: tuple[int, int] = (100_000, 400_000)
    default_limit_mw: int = 400_000
    limit_mw: int = 400_000
    power_usage_mw: int = 90_000
    instant_power_mw: int | None = 95_500
    energy_mj: int = 1_000_000
    energy_supported: bool = True


class FakeNvml:
    """Build with GPUs, script failures with `fail`, then install `module` as `pynvml`."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.failures: dict[tuple[str, int | None], int] = {}
        self.module = self._build()

    def fail(self, function: str, error: str, gpu: int | None = None) -> None:
        """Make `function` (e.g. "nvmlDeviceSetGpuLockedClocks") raise NVML error `error`, e.g. "TIMEOUT"."""
        self.failures[(function, gpu)] = ERROR_CODES[f"NVML_ERROR_{error}"]

    def calls_to(self, function: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == function]

    def _build(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")

        class NVMLError(Exception):
            def __init__(self, value: int) -> None:
                super().__init__(f"NVML error code {value}")
                self.value = value

        module.NVMLError = NVMLError  # type: ignore[attr-defined]
        for name, code in ERROR_CODES.items():
            setattr(module, name, code)
        module.NVML_SUCCESS = 0  # type: ignore[attr-defined]
        module.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
        module.NVML_FI_DEV_POWER_INSTANT = 186  # type: ignore[attr-defined]
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(module, name, self._recorded(name, getattr(self, name), NVMLError))
        return module

    def _recorded(self, name: str, impl: Callable[..., Any], error: type[Exception]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            gpu = (
                args[0]
                if args and isinstance(args[0], int) and name != "nvmlDeviceGetHandleByIndex"
                else None
            )
            if name == "nvmlDeviceGetHandleByIndex":
                gpu = args[0]
            code = self.failures.get((name, gpu), self.failures.get((name, None)))
            if code is not None:
                raise error(code)
            return impl(*args)

        return call

    # The fake NVML API; a handle is the GPU index.

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> bytes:  # noqa: N802
        return self.gpus[h].name.encode()

    def nvmlDeviceGetPciInfo(self, h: int) -> types.SimpleNamespace:  # noqa: N802
        return types.SimpleNamespace(busId=self.gpus[h].bus_id)

    def nvmlDeviceGetSupportedMemoryClocks(self, h: int) -> list[int]:  # noqa: N802
        return list(self.gpus[h].graphics_clocks_by_memory_mhz)

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: int, memory_mhz: int) -> list[int]:  # noqa: N802
        return self.gpus[h].graphics_clocks_by_memory_mhz[memory_mhz]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> list[int]:  # noqa: N802
        return list(self.gpus[h].power_limits_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:  # noqa: N802
        return self.gpus[h].default_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:  # noqa: N802
        return self.gpus[h].limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, h: int, limit_mw: int) -> None:  # noqa: N802
        self.gpus[h].limit_mw = limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:  # noqa: N802
        if not self.gpus[h].energy_supported:
            raise self.module.NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
        return self.gpus[h].energy_mj

    def nvmlDeviceSetGpuLockedClocks(self, h: int, low_mhz: int, high_mhz: int) -> None:  # noqa: N802
        assert low_mhz <= high_mhz
        self.gpus[h].sm_clock_mhz = high_mhz

    def nvmlDeviceResetGpuLockedClocks(self, h: int) -> None:  # noqa: N802
        self.gpus[h].sm_clock_mhz = 1410

    def nvmlDeviceGetClockInfo(self, h: int, clock_type: int) -> int:  # noqa: N802
        assert clock_type == 1
        return self.gpus[h].sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:  # noqa: N802
        return self.gpus[h].clock_event_reasons

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        return self.gpus[h].power_usage_mw

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[int]) -> list[types.SimpleNamespace]:  # noqa: N802
        assert field_ids == [186]
        instant = self.gpus[h].instant_power_mw
        code = 0 if instant is not None else ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"]
        value = types.SimpleNamespace(uiVal=instant or 0)
        return [types.SimpleNamespace(nvmlReturn=code, value=value)]

"""The driver power features that can fight the daemon's clocks, read from NVML (a scripted NVML: the only
mock, at the NVML boundary) and shown by a simulated daemon (none)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from perseusd.gpu.nvml import NvmlErrors
from perseusd.gpu.power_features import nvml_power_features


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


NOT_SUPPORTED = 3
pynvml = pytest.importorskip("pynvml")  # its ctypes structures (no NVML library is loaded)
PROFILES_STRUCT = pynvml.c_nvmlWorkloadPowerProfileCurrentProfiles_v1_t


class _Mask:
    def __init__(self, bits: list[int]) -> None:
        self.mask = [sum(1 << (b - 32 * w) for b in bits if b // 32 == w) for w in range(8)]


class _Profiles:
    def __init__(self) -> None:
        self.version = 0
        self.enforcedProfilesMask = _Mask([])


def _field(ret: int, value: int) -> Any:
    return types.SimpleNamespace(nvmlReturn=ret, value=types.SimpleNamespace(uiVal=value))


def _nvml(profiles: list[int] | None, smoothing: tuple[int, int, int] | None, *, exposed: bool = True) -> Any:
    """`profiles`: enforced profile ids (None: NOT_SUPPORTED); `smoothing`: (return code, enabled, floor W)
    of the field values (None: the call itself NOT_SUPPORTED)."""

    def get_profiles(_handle: object, ref: Any) -> int:
        if profiles is None:
            raise NVMLError(NOT_SUPPORTED)
        for bit in profiles:
            ref._obj.enforcedProfilesMask.mask[bit // 32] |= 1 << (bit % 32)
        return 0

    def field_values(_handle: object, _ids: list[int]) -> list[Any]:
        if smoothing is None:
            raise NVMLError(NOT_SUPPORTED)
        ret, enabled, floor = smoothing
        return [_field(ret, enabled), _field(ret, floor)]

    module = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_ERROR_NOT_SUPPORTED=NOT_SUPPORTED,
        nvmlDeviceGetFieldValues=field_values,
        NVML_FI_PWR_SMOOTHING_ENABLED=251,
        NVML_FI_PWR_SMOOTHING_PRIMARY_POWER_FLOOR=275,
    )
    if exposed:
        module.nvmlDeviceWorkloadPowerProfileGetCurrentProfiles = get_profiles
        module.c_nvmlWorkloadPowerProfileCurrentProfiles_v1_t = (
            pynvml.c_nvmlWorkloadPowerProfileCurrentProfiles_v1_t
        )
        module.nvmlWorkloadPowerProfileCurrentProfiles_v1 = 16777316
    return module


def _texts(module: Any) -> list[str]:
    return [f.text() for f in nvml_power_features(module, NvmlErrors(module), "GPU-x", object())]


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (
            _nvml(None, None),
            ["workload power profile: not supported", "power smoothing: not supported"],
        ),
        (
            _nvml([], (0, 0, 0)),
            ["workload power profile: inactive", "power smoothing: inactive"],
        ),
        (
            _nvml([0, 33], (0, 1, 350)),
            [
                "workload power profile: active (enforced profile(s) 0,33)",
                "power smoothing: active (primary power floor 350 W)",
            ],
        ),
        (
            _nvml(None, (NOT_SUPPORTED, 0, 0), exposed=False),
            [
                "workload power profile: not exposed (nvidia-ml-py has no call for it)",
                "power smoothing: not supported",
            ],
        ),
    ],
    ids=["h100-today", "off", "on", "old-bindings"],
)
def test_features_as_nvml_reports_them(module: Any, expected: list[str]) -> None:
    assert _texts(module) == expected

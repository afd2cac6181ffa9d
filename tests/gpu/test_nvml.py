"""The NVML backend over a scripted fake `pynvml`: what the hardware was told, and every error path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import perseusd.gpu
from perseusd.errors import GpuError
from perseusd.gpu.backend import CLOCK_EVENT_SW_POWER_CAP, power_capped
from perseusd.gpu.errors import (
    GpuLostError,
    GpuNotSupportedError,
    GpuPermissionError,
    GpuResetRequiredError,
    GpuTimeoutError,
    GpuUnknownError,
    NvmlLibraryError,
)
from perseusd.gpu.nvml import NVML_ERROR_TABLE, NvmlBackend, NvmlErrors

from .fake_pynvml import FakeGpu, FakeNvml


def test_enumeration_reads_facts_from_the_highest_memory_clock(fake_nvml: FakeNvml) -> None:
    backend = NvmlBackend()
    info = backend.devices()[0].info
    assert info.uuid == "GPU-11111111-0000-0000-0000-000000000000"
    assert info.name == "NVIDIA A100-SXM4-80GB"
    assert info.pci_bus_id == "00000000:07:00.0"
    assert info.supported_sm_clocks_mhz[0] == 1410
    assert info.supported_sm_clocks_mhz[-1] == 210
    assert 397 not in info.supported_sm_clocks_mhz
    assert fake_nvml.calls_to("nvmlDeviceGetSupportedGraphicsClocks")[0] == (0, 1593)
    assert (info.power_limit_min_w, info.power_limit_max_w, info.power_limit_default_w) == (
        100.0,
        400.0,
        400.0,
    )
    assert info.energy_counter_supported


def test_set_locked_clock_snaps_and_tells_nvml_min_equal_max(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[0]
    assert device.set_locked_sm_clock_mhz(1001) == 1005
    assert fake_nvml.calls_to("nvmlDeviceSetGpuLockedClocks") == [(0, 1005, 1005)]
    device.reset_locked_sm_clock()
    assert fake_nvml.calls_to("nvmlDeviceResetGpuLockedClocks") == [(0,)]
    assert device.locked_sm_clock_mhz() is None


def test_clock_event_reasons_tell_a_power_capped_clock(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[0]
    assert device.clock_event_reasons() == 0
    fake_nvml.gpus[0].clock_event_reasons = CLOCK_EVENT_SW_POWER_CAP | 0x1  # power cap, GPU idle
    fake_nvml.gpus[0].sm_clock_mhz = 1710
    assert power_capped(device.clock_event_reasons())
    assert device.sm_clock_mhz() == 1710
    assert fake_nvml.calls_to("nvmlDeviceGetCurrentClocksEventReasons")[-1] == (0,)
    fake_nvml.gpus[0].clock_event_reasons = 0x1
    assert not power_capped(device.clock_event_reasons())


def test_power_limit_is_sent_in_milliwatts_and_enforced_is_read_back(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[1]
    fake_nvml.gpus[1].limit_mw = 250_000
    assert device.power_limit_w() == 250.0
    device.set_power_limit_w(300.25)
    assert fake_nvml.calls_to("nvmlDeviceSetPowerManagementLimit") == [(1, 300_250)]
    assert fake_nvml.calls_to("nvmlDeviceGetEnforcedPowerLimit")[-1] == (1,)


def test_power_prefers_the_instant_field_then_falls_back(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[0]
    assert device.power_w() == 95.5
    fake_nvml.gpus[0].instant_power_mw = None
    assert device.power_w() == 90.0
    assert device.power_w() == 90.0
    assert len(fake_nvml.calls_to("nvmlDeviceGetFieldValues")) == 2


def test_energy_counter_and_unsupported_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a", energy_mj=123_456), FakeGpu(uuid="GPU-b", energy_supported=False)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    first, second = NvmlBackend().devices()
    assert first.energy_mj() == 123_456
    assert not second.info.energy_counter_supported
    with pytest.raises(GpuNotSupportedError):
        second.energy_mj()


def test_not_supported_carries_uuid_op_and_code(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[0]
    fake_nvml.fail("nvmlDeviceSetGpuLockedClocks", "NOT_SUPPORTED")
    with pytest.raises(GpuNotSupportedError) as caught:
        device.set_locked_sm_clock_mhz(1200)
    assert caught.value.uuid == device.info.uuid
    assert caught.value.op == "set_locked_sm_clock_mhz"
    assert caught.value.nvml_code == 3
    assert device.locked_sm_clock_mhz() is None


def test_no_permission_says_what_to_do(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[0]
    fake_nvml.fail("nvmlDeviceSetPowerManagementLimit", "NO_PERMISSION")
    with pytest.raises(GpuPermissionError, match="run perseusd as root or grant CAP_SYS_ADMIN"):
        device.set_power_limit_w(200.0)


def test_failed_reset_keeps_the_tracked_clock(fake_nvml: FakeNvml) -> None:
    device = NvmlBackend().devices()[0]
    device.set_locked_sm_clock_mhz(1200)
    fake_nvml.fail("nvmlDeviceResetGpuLockedClocks", "RESET_REQUIRED")
    with pytest.raises(GpuResetRequiredError):
        device.reset_locked_sm_clock()
    assert device.locked_sm_clock_mhz() == 1200


@pytest.mark.parametrize(
    ("code", "expected"),
    [("GPU_IS_LOST", GpuLostError), ("TIMEOUT", GpuTimeoutError), ("UNKNOWN", GpuUnknownError)],
)
def test_read_errors_are_typed(fake_nvml: FakeNvml, code: str, expected: type[GpuError]) -> None:
    device = NvmlBackend().devices()[0]
    fake_nvml.fail("nvmlDeviceGetTotalEnergyConsumption", code)
    with pytest.raises(expected) as caught:
        device.energy_mj()
    assert isinstance(caught.value, GpuError)


def test_gpu_lost_during_enumeration_is_left_out(fake_nvml: FakeNvml) -> None:
    fake_nvml.fail("nvmlDeviceGetUUID", "GPU_IS_LOST", gpu=1)
    backend = NvmlBackend()
    assert [d.info.index for d in backend.devices()] == [0]
    assert isinstance(backend.enumeration_errors[0], GpuLostError)


def test_missing_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlLibraryError, match="nvidia-ml-py"):
        NvmlBackend()


@pytest.mark.parametrize("code", ["LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED", "UNINITIALIZED"])
def test_missing_library_or_driver(fake_nvml: FakeNvml, code: str) -> None:
    fake_nvml.fail("nvmlInit", code)
    with pytest.raises(NvmlLibraryError, match="--backend sim"):
        NvmlBackend()


def test_unknown_code_becomes_unknown_error(fake_nvml: FakeNvml) -> None:
    errors = NvmlErrors(fake_nvml.module)
    error = errors.translate(fake_nvml.module.NVMLError(12345), op="x", uuid="GPU-z")
    assert type(error) is GpuUnknownError
    assert error.nvml_code == 12345


def test_table_covers_every_code_of_the_real_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    codes = {name for name in dir(pynvml) if name.startswith("NVML_ERROR_")}
    assert codes <= set(NVML_ERROR_TABLE)
    errors = NvmlErrors(pynvml)
    lost = errors.translate(pynvml.NVMLError_GpuIsLost(), op="energy_mj", uuid="GPU-x")
    assert isinstance(lost, GpuLostError)
    denied = errors.translate(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), op="set", uuid=None)
    assert isinstance(denied, GpuPermissionError)


def test_only_nvml_module_imports_pynvml_and_package_imports_without_it() -> None:
    package_dir = Path(perseusd.gpu.__file__).parent.parent
    importers = [
        path.name for path in package_dir.rglob("*.py") if "import pynvml" in path.read_text(encoding="utf-8")
    ]
    assert importers == ["nvml.py"]
    code = (
        "import sys; sys.modules['pynvml'] = None\n"
        "import perseusd.gpu.nvml, perseusd.gpu.sim, perseusd.gpu.owner, perseusd.gpu.select\n"
        "assert sys.modules['pynvml'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)

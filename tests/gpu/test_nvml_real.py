"""Real-GPU checks of the NVML backend; skipped unless an NVIDIA GPU with NVML is present.

Setters need root or CAP_SYS_ADMIN: without them the clock tests are skipped. Measurements are attached to the
test report (`record_property`) and logged; `benchmarks/nvml_probe.py` prints the same as JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from perseusd.errors import GpuError
from perseusd.gpu.backend import GpuDevice
from perseusd.gpu.errors import GpuPermissionError
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.probe import clock_switch_latency, energy_counter_period

pytestmark = pytest.mark.gpu
logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def device() -> Iterator[GpuDevice]:
    try:
        backend = NvmlBackend()
    except GpuError as error:
        pytest.skip(f"no NVML: {error}")
    if not backend.devices():
        backend.close()
        pytest.skip("no NVIDIA GPU")
    yield backend.devices()[0]
    backend.close()


def test_enumerates(device: GpuDevice) -> None:
    info = device.info
    assert info.uuid.startswith("GPU-")
    assert info.supported_sm_clocks_mhz
    assert info.power_limit_min_w <= info.power_limit_max_w


def test_set_and_reset_locked_clock(
    device: GpuDevice, record_property: Callable[[str, object], None]
) -> None:
    clocks = device.info.supported_sm_clocks_mhz
    try:
        applied = device.set_locked_sm_clock_mhz(clocks[len(clocks) // 2] + 1)
    except GpuPermissionError:
        pytest.skip("needs root or CAP_SYS_ADMIN")
    try:
        assert applied in clocks
        assert device.locked_sm_clock_mhz() == applied
        switch = clock_switch_latency(device, clocks[0])
        record_property("clock_switch", switch)
        logger.info("clock switch: %s", switch)
    finally:
        device.reset_locked_sm_clock()
    assert device.locked_sm_clock_mhz() is None


def test_energy_counter_update_period(
    device: GpuDevice, record_property: Callable[[str, object], None]
) -> None:
    if not device.info.energy_counter_supported:
        pytest.skip("energy counter not supported")
    period = energy_counter_period(device, duration_s=1.0)
    record_property("energy_counter_period", period)
    logger.info("energy counter: %s", period)
    assert period.changes >= 2

"""The GPU call recorder: every device call of a simulated GPU timed into buckets, failures by code."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseusd.gpu.errors import GpuPermissionError
from perseusd.gpu.sim import SimBackend
from perseusd.metrics.gpu_calls import CALL_BUCKETS_S, GpuCallRecorder, TimedDevice, error_code


def test_calls_are_timed_and_failures_counted_by_code(tmp_path: Path) -> None:
    backend = SimBackend(tmp_path / "sim", gpus=1, model="a100_sxm", noise=0.0)
    try:
        device = backend.devices()[0]
        recorder = GpuCallRecorder()
        timed = TimedDevice(device, recorder)
        uuid = device.info.uuid
        assert timed.info == device.info
        for _ in range(3):
            assert timed.power_w() == device.power_w()
        assert timed.set_locked_sm_clock_mhz(1200) == timed.locked_sm_clock_mhz()
        device.inject_fault("power_limit_w", "error", error="no_permission")  # type: ignore[attr-defined]
        with pytest.raises(GpuPermissionError):
            timed.power_limit_w()
        histograms = recorder.histograms()
        assert histograms[(uuid, "power_w")].count == 3
        assert len(histograms[(uuid, "power_w")].bucket_counts) == len(CALL_BUCKETS_S) + 1
        assert histograms[(uuid, "power_w")].sum_s > 0
        assert histograms[(uuid, "power_limit_w")].count == 1
        assert recorder.errors() == {(uuid, "GpuPermissionError"): 1}
    finally:
        backend.close()


def test_nvml_errors_are_labelled_by_return_code() -> None:
    assert error_code(GpuPermissionError("denied", nvml_code=4)) == "nvml_4"
    assert error_code(TimeoutError()) == "TimeoutError"

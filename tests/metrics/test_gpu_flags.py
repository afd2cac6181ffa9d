"""The per-GPU capped, throttled and lowered-limit flags, from one reading each (no daemon needed)."""

from __future__ import annotations

from perseusd.gpu.backend import CLOCK_EVENT_SW_POWER_CAP, CLOCK_EVENT_SW_THERMAL, GpuInfo
from perseusd.gpu.reading import GpuReading
from perseusd.metrics.collector import _GpuFamilies

INFO = GpuInfo(
    uuid="GPU-test",
    index=0,
    name="test board",
    pci_bus_id="0000:00:00.0",
    supported_sm_clocks_mhz=(1980, 1200),
    power_limit_min_w=200.0,
    power_limit_max_w=700.0,
    power_limit_default_w=700.0,
    energy_counter_supported=True,
)


def flags(reasons: int | None, limit_w: float) -> dict[str, float]:
    families = _GpuFamilies()
    reading = GpuReading("GPU-test", 1710, 1980, 690.0, limit_w, 1000, clock_event_reasons=reasons)
    families.add_reading(["GPU-test", "test board", "0"], INFO, reading)
    return {
        metric.name: metric.samples[0].value
        for metric in families.all()
        if metric.name.endswith(("power_capped", "clock_throttled", "power_limit_lowered")) and metric.samples
    }


def test_power_cap_reason_sets_capped_and_throttled() -> None:
    assert flags(CLOCK_EVENT_SW_POWER_CAP, 700.0) == {
        "perseus_gpu_power_capped": 1.0,
        "perseus_gpu_clock_throttled": 1.0,
        "perseus_gpu_power_limit_lowered": 0.0,
    }


def test_thermal_slowdown_is_throttled_but_not_capped() -> None:
    got = flags(CLOCK_EVENT_SW_THERMAL, 700.0)
    assert got["perseus_gpu_power_capped"] == 0.0
    assert got["perseus_gpu_clock_throttled"] == 1.0


def test_a_lowered_limit_is_its_own_flag_and_unknown_reasons_leave_the_flags_out() -> None:
    assert flags(None, 350.0) == {"perseus_gpu_power_limit_lowered": 1.0}

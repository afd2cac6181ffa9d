"""The backend contract, run against the simulated backend and the NVML backend over a fake `pynvml`."""

from __future__ import annotations

from perseusd.gpu.backend import GpuBackend, GpuState


def test_enumerates_gpus_with_sane_facts(any_backend: GpuBackend) -> None:
    devices = any_backend.devices()
    assert len(devices) == 2
    uuids = [d.info.uuid for d in devices]
    assert len(set(uuids)) == 2
    for index, device in enumerate(devices):
        info = device.info
        assert info.uuid.startswith("GPU-")
        assert info.index == index
        assert info.name
        assert info.pci_bus_id
        clocks = info.supported_sm_clocks_mhz
        assert len(clocks) > 10
        assert list(clocks) == sorted(clocks, reverse=True)
        assert info.power_limit_min_w <= info.power_limit_default_w <= info.power_limit_max_w
        assert info.energy_counter_supported


def test_locked_clock_snaps_and_is_reported(any_backend: GpuBackend) -> None:
    device = any_backend.devices()[0]
    clocks = device.info.supported_sm_clocks_mhz
    target = clocks[len(clocks) // 2]
    assert device.locked_sm_clock_mhz() is None
    assert device.set_locked_sm_clock_mhz(target + 4) == target
    assert device.locked_sm_clock_mhz() == target
    assert device.sm_clock_mhz() == target
    assert device.set_locked_sm_clock_mhz(1) == clocks[-1]
    assert device.set_locked_sm_clock_mhz(100_000) == clocks[0]
    device.reset_locked_sm_clock()
    assert device.locked_sm_clock_mhz() is None
    assert device.sm_clock_mhz() == clocks[0]


def test_power_limit_is_clamped_and_reported(any_backend: GpuBackend) -> None:
    device = any_backend.devices()[1]
    info = device.info
    assert device.power_limit_w() == info.power_limit_default_w
    assert device.set_power_limit_w(250.5) == 250.5
    assert device.power_limit_w() == 250.5
    assert device.set_power_limit_w(10_000.0) == info.power_limit_max_w
    assert device.set_power_limit_w(1.0) == info.power_limit_min_w
    assert device.power_limit_w() == info.power_limit_min_w


def test_energy_is_monotonic_integer_and_power_positive(any_backend: GpuBackend) -> None:
    device = any_backend.devices()[0]
    first = device.energy_mj()
    second = device.energy_mj()
    assert isinstance(first, int)
    assert second >= first
    power = device.power_w()
    assert isinstance(power, float)
    assert power > 0


def test_state_reflects_writes_and_devices_are_independent(any_backend: GpuBackend) -> None:
    first, second = any_backend.devices()
    applied = first.set_locked_sm_clock_mhz(first.info.supported_sm_clocks_mhz[3])
    first.set_power_limit_w(200.0)
    assert first.state() == GpuState(locked_sm_clock_mhz=applied, power_limit_w=200.0)
    assert second.state() == GpuState(
        locked_sm_clock_mhz=None, power_limit_w=second.info.power_limit_default_w
    )


def test_close_is_idempotent(any_backend: GpuBackend) -> None:
    any_backend.close()
    any_backend.close()

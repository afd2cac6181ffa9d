"""The GPU owner thread: serialisation, skipping, timing, health, errors."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from perseusd.gpu.backend import GpuState
from perseusd.gpu.errors import GpuOwnerStoppedError, GpuPermissionError
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.sim import SimBackend, SimDevice

from .forwarding import ForwardingDevice
from .started import started


class RecordingDevice(ForwardingDevice):
    """Wraps a device; records every call and the most calls ever running at once."""

    def __init__(self, inner: SimDevice) -> None:
        super().__init__(inner)
        self.calls: list[str] = []
        self.running = 0
        self.max_running = 0
        self._lock = threading.Lock()

    def before(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        time.sleep(0.0005)
        with self._lock:
            self.running -= 1


@pytest.fixture
def sim_device(tmp_path: Path) -> Iterator[SimDevice]:
    backend = SimBackend(tmp_path, noise=0.0)
    yield backend.sim_devices()[0]
    backend.close()


@pytest.fixture
def recording(sim_device: SimDevice) -> RecordingDevice:
    return RecordingDevice(sim_device)


@pytest.fixture
def owner(recording: RecordingDevice) -> Iterator[GpuOwner]:
    with started(GpuOwner(recording, call_timeout_s=0.1)) as gpu:
        yield gpu


def test_calls_from_many_threads_are_serialised_in_order(owner: GpuOwner, recording: RecordingDevice) -> None:
    futures: list[Future[int]] = []

    def submit(base: int) -> None:
        for i in range(10):
            futures.append(owner.set_locked_sm_clock_mhz(base + 15 * i))

    threads = [threading.Thread(target=submit, args=(900 + 150 * t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for future in futures:
        future.result(timeout=5)
    assert recording.max_running == 1
    stats = owner.stats()["set_locked_sm_clock_mhz"]
    assert len(recording.calls) + stats["skipped"] + stats["superseded"] == 40


def test_equal_requests_are_skipped(owner: GpuOwner, recording: RecordingDevice) -> None:
    assert owner.set_locked_sm_clock_mhz(1005).result(timeout=5) == 1005
    assert owner.set_locked_sm_clock_mhz(1005).result(timeout=5) == 1005
    assert owner.set_locked_sm_clock_mhz(1001).result(timeout=5) == 1005
    owner.reset_locked_sm_clock().result(timeout=5)
    owner.reset_locked_sm_clock().result(timeout=5)
    assert owner.set_power_limit_w(300.0).result(timeout=5) == 300.0
    assert owner.set_power_limit_w(300.0).result(timeout=5) == 300.0
    assert recording.calls == ["set_locked_sm_clock_mhz", "reset_locked_sm_clock", "set_power_limit_w"]
    stats = owner.stats()
    assert stats["set_locked_sm_clock_mhz"]["calls"] == 1
    assert stats["set_locked_sm_clock_mhz"]["skipped"] == 2
    assert stats["reset_locked_sm_clock"]["skipped"] == 1
    assert stats["set_power_limit_w"]["skipped"] == 1


def test_a_clock_set_leaves_nothing_for_the_garbage_collector(owner: GpuOwner) -> None:
    """A plan sets a clock at nearly every computation: what a clock set allocates is freed when it is done,
    not left in reference cycles for the cyclic collector (which then runs on the daemon's main loop)."""
    clocks_mhz = owner.info.supported_sm_clocks_mhz
    gc.collect()
    gc.disable()
    try:
        for i in range(200):
            future = owner.set_locked_sm_clock_mhz(clocks_mhz[i % 2 * 10])
            future.add_done_callback(lambda done: done.result())
            future.result(timeout=5)
        owner.read().result(timeout=5)  # the owner thread is past the last clock set
        del future
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_save_and_restore_never_skip(owner: GpuOwner, recording: RecordingDevice) -> None:
    saved = owner.save_state().result(timeout=5)
    assert saved == GpuState(locked_sm_clock_mhz=None, power_limit_w=500.0)
    owner.reset_locked_sm_clock().result(timeout=5)
    assert "reset_locked_sm_clock" not in recording.calls
    owner.set_locked_sm_clock_mhz(1200).result(timeout=5)
    owner.restore(saved).result(timeout=5)
    assert recording.calls[-2:] == ["reset_locked_sm_clock", "set_power_limit_w"]
    assert recording.inner.state() == saved
    owner.restore(GpuState(locked_sm_clock_mhz=1110, power_limit_w=200.0)).result(timeout=5)
    assert recording.inner.state() == GpuState(locked_sm_clock_mhz=1110, power_limit_w=200.0)


def test_every_call_is_timed(owner: GpuOwner, sim_device: SimDevice) -> None:
    sim_device.inject_fault("power_limit_w", "slow", delay_s=0.03)
    owner.read().result(timeout=5)
    stats = owner.stats()["power_limit_w"]
    assert stats["calls"] == 1
    assert stats["max_s"] >= 0.03
    assert stats["last_s"] == stats["max_s"] == stats["total_s"]
    assert owner.stats()["energy_mj"]["calls"] == 1


def test_a_hung_call_makes_the_owner_unhealthy(owner: GpuOwner, sim_device: SimDevice) -> None:
    assert owner.healthy()
    sim_device.inject_fault("energy_mj", "slow", delay_s=0.4)
    reading = owner.read()
    deadline_s = time.monotonic() + 1.0
    while owner.healthy() and time.monotonic() < deadline_s:
        time.sleep(0.01)
    assert not owner.healthy()
    assert reading.result(timeout=5).error is None
    assert owner.healthy()


def test_errors_propagate_typed_and_unknown_state_is_retried(
    owner: GpuOwner, sim_device: SimDevice, recording: RecordingDevice
) -> None:
    sim_device.inject_fault("set_power_limit_w", "error", error="no_permission")
    with pytest.raises(GpuPermissionError):
        owner.set_power_limit_w(250.0).result(timeout=5)
    assert owner.stats()["set_power_limit_w"]["errors"] == 1
    sim_device.clear_faults()
    assert owner.set_power_limit_w(250.0).result(timeout=5) == 250.0
    assert recording.calls.count("set_power_limit_w") == 2


def test_read_never_raises(owner: GpuOwner, sim_device: SimDevice) -> None:
    sim_device.set_locked_sm_clock_mhz(1200)
    good = owner.read().result(timeout=5)
    assert (good.sm_clock_mhz, good.locked_sm_clock_mhz, good.power_limit_w) == (1200, 1200, 500.0)
    assert good.energy_mj is not None
    assert good.power_w is not None
    assert good.error is None
    sim_device.inject_fault("*", "lost")
    bad = owner.read().result(timeout=5)
    assert bad.uuid == sim_device.info.uuid
    assert (bad.sm_clock_mhz, bad.locked_sm_clock_mhz, bad.power_w, bad.power_limit_w, bad.energy_mj) == (
        None,
    ) * 5
    assert bad.error is not None
    assert "lost" in bad.error


def test_stop_fails_later_commands_and_unhealthy(recording: RecordingDevice) -> None:
    gpu = GpuOwner(recording)
    assert not gpu.healthy()
    queued = gpu.set_power_limit_w(200.0)
    gpu.start()
    assert queued.result(timeout=5) == 200.0
    gpu.stop()
    assert not gpu.healthy()
    with pytest.raises(GpuOwnerStoppedError):
        gpu.read().result(timeout=5)
    assert gpu.info.uuid == recording.info.uuid

"""Clock sets never queue behind each other: a newer request supersedes one not yet applied (latest wins)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.sim import SimBackend, SimDevice

from .forwarding import ForwardingDevice
from .started import started

SET_CALL_S = 0.01
"""What a clock lock blocks its caller on an H100 (~10 ms), injected as a "slow" fault."""


class TimedDevice(ForwardingDevice):
    """Wraps a device; records (start, end, clock) of every clock-set call and the order of all calls."""

    def __init__(self, inner: SimDevice) -> None:
        super().__init__(inner)
        self.sets: list[tuple[float, float, int]] = []
        self.calls: list[str] = []
        self.watched: list[Future[int]] = []  # the test's requests, in the order made
        self.done_at_start: list[list[bool]] = []  # per set call: which watched requests were done
        self.set_started = threading.Event()
        self.gate = threading.Event()  # clock sets wait for it once they have started
        self.gate.set()

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        self.calls.append(f"set {clock_mhz}")
        started_s = time.monotonic()
        self.done_at_start.append([future.done() for future in list(self.watched)])
        self.set_started.set()
        self.gate.wait(10)
        applied_mhz = self.inner.set_locked_sm_clock_mhz(clock_mhz)
        self.sets.append((started_s, time.monotonic(), applied_mhz))
        return applied_mhz

    def reset_locked_sm_clock(self) -> None:
        self.calls.append("reset")
        self.inner.reset_locked_sm_clock()

    def set_power_limit_w(self, limit_w: float) -> float:
        self.calls.append(f"limit {limit_w:g}")
        return self.inner.set_power_limit_w(limit_w)


@pytest.fixture
def device(tmp_path: Path) -> Iterator[TimedDevice]:
    backend = SimBackend(tmp_path, noise=0.0)
    sim = backend.sim_devices()[0]
    sim.inject_fault("set_locked_sm_clock_mhz", "slow", delay_s=SET_CALL_S)
    yield TimedDevice(sim)
    backend.close()


@pytest.fixture
def owner(device: TimedDevice) -> Iterator[GpuOwner]:
    with started(GpuOwner(device, call_timeout_s=5.0)) as gpu:
        yield gpu


def test_requests_faster_than_a_set_call_never_build_a_queue(owner: GpuOwner, device: TimedDevice) -> None:
    """Every request is applied by the set call that takes the clock after it was made: at most the call
    running when it came, the one that takes its target (or a newer one) and nothing more, however fast
    requests arrive. Judged by order, not by time: when the second set call that starts after a request
    starts, the owner has already answered it (a queue would leave it waiting behind all the others)."""
    clocks = [1005, 1410] * 50
    submitted_s: list[float] = []
    for clock_mhz in clocks:
        submitted_s.append(time.monotonic())
        device.watched.append(owner.set_locked_sm_clock_mhz(clock_mhz))
        time.sleep(SET_CALL_S / 5)
    results = [future.result(timeout=10) for future in device.watched]
    assert len(device.sets) <= len(clocks)
    assert device.sets[-1][2] == clocks[-1] == results[-1]  # the last request wins
    starts_s = [start_s for start_s, _, _ in device.sets]
    checked = 0
    for i, made_s in enumerate(submitted_s):
        later = [k for k, start_s in enumerate(starts_s) if start_s >= made_s]
        # The first call after it may have taken its target just before the request came (the slot
        # closes as a call begins): the second one after it is where it must already be answered.
        if len(later) >= 2 and len(device.done_at_start[later[1]]) > i:
            assert device.done_at_start[later[1]][i], f"request {i} waited beyond the next set call"
            checked += 1
    assert checked > 0
    stats = owner.stats()["set_locked_sm_clock_mhz"]
    assert stats["calls"] + stats["skipped"] + stats["superseded"] == len(clocks)


def test_requests_made_during_one_set_call_cost_one_more_call(owner: GpuOwner, device: TimedDevice) -> None:
    device.gate.clear()
    first = owner.set_locked_sm_clock_mhz(900)
    assert device.set_started.wait(5)
    waiting = [owner.set_locked_sm_clock_mhz(1005 + 15 * (i % 20)) for i in range(200)]
    device.gate.set()
    assert first.result(timeout=5) == 900
    assert {future.result(timeout=5) for future in waiting} == {1005 + 15 * (199 % 20)}
    assert [clock for _, _, clock in device.sets] == [900, 1005 + 15 * (199 % 20)]
    assert owner.stats()["set_locked_sm_clock_mhz"]["superseded"] == 199


def test_a_superseded_request_gives_the_clock_applied_in_its_place(
    owner: GpuOwner, device: TimedDevice
) -> None:
    device.gate.clear()
    first = owner.set_locked_sm_clock_mhz(900)  # running until the gate opens
    assert device.set_started.wait(5)
    middle = owner.set_locked_sm_clock_mhz(1200)  # queued behind it...
    last = owner.set_locked_sm_clock_mhz(1395)  # ...and superseded by this one
    device.gate.set()
    assert first.result(timeout=5) == 900
    assert middle.result(timeout=5) == last.result(timeout=5) == 1395
    assert [clock for _, _, clock in device.sets] == [900, 1395]


def test_state_changes_keep_their_order_around_clock_sets(owner: GpuOwner, device: TimedDevice) -> None:
    """A reset or a power limit queued after a clock set is never overtaken by a newer clock set."""
    device.gate.clear()
    owner.set_locked_sm_clock_mhz(900)  # running until the gate opens
    assert device.set_started.wait(5)
    owner.set_locked_sm_clock_mhz(1200)  # queued
    reset = owner.reset_locked_sm_clock()  # a barrier: 1200 must come before it
    owner.set_locked_sm_clock_mhz(1305)  # queued after the reset...
    limit = owner.set_power_limit_w(300.0)  # ...and its own barrier
    final = owner.set_locked_sm_clock_mhz(1395)
    device.gate.set()
    reset.result(timeout=5)
    limit.result(timeout=5)
    assert final.result(timeout=5) == 1395
    sets_and_resets = [c for c in device.calls if not c.startswith("limit")]
    assert sets_and_resets == ["set 900", "set 1200", "reset", "set 1305", "set 1395"]
    assert device.calls.index("limit 300") == device.calls.index("set 1305") + 1
    assert device.inner.locked_sm_clock_mhz() == 1395


def test_reads_do_not_hold_a_newer_clock_back(owner: GpuOwner, device: TimedDevice) -> None:
    device.gate.clear()
    owner.set_locked_sm_clock_mhz(900)  # running until the gate opens
    assert device.set_started.wait(5)
    owner.set_locked_sm_clock_mhz(1200)
    reading = owner.read()
    energy = owner.read_energy()
    newest = owner.set_locked_sm_clock_mhz(1395)
    device.gate.set()
    assert newest.result(timeout=5) == 1395
    reading.result(timeout=5)
    energy.result(timeout=5)
    assert [clock for _, _, clock in device.sets] == [900, 1395]


def test_requests_from_many_threads_end_at_one_of_the_last(owner: GpuOwner, device: TimedDevice) -> None:
    lasts: list[int] = []

    def submit(base_mhz: int) -> None:
        futures = [owner.set_locked_sm_clock_mhz(base_mhz + 15 * i) for i in range(20)]
        lasts.append(base_mhz + 15 * 19)
        for future in futures:
            future.result(timeout=10)

    threads = [threading.Thread(target=submit, args=(600 + 210 * t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert device.inner.locked_sm_clock_mhz() in lasts


class UnevenDevice(ForwardingDevice):
    """Wraps a device; its clock-set calls take the given durations in turn."""

    def __init__(self, inner: SimDevice, durations_s: list[float]) -> None:
        super().__init__(inner)
        self.durations_s = durations_s

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        time.sleep(self.durations_s.pop(0))
        return self.inner.set_locked_sm_clock_mhz(clock_mhz)


def test_clock_set_latency_quantiles_tell_a_slow_tail_from_the_median(tmp_path: Path) -> None:
    """Seven quick set calls and one slow one: the median is a quick call's, the maximum the slow one's, and
    the 90th percentile (what an early raise allows for) lies between, interpolated."""
    backend = SimBackend(tmp_path, noise=0.0)
    device = UnevenDevice(backend.sim_devices()[0], [0.005] * 7 + [0.2])
    try:
        with started(GpuOwner(device, call_timeout_s=5.0)) as gpu:
            for clock_mhz in (900, 1200) * 4:
                gpu.set_locked_sm_clock_mhz(clock_mhz).result(timeout=5)
            median_s, p90_s, top_s = (gpu.clock_set_latency_s(q) for q in (0.5, 0.9, 1.0))
    finally:
        backend.close()
    assert median_s is not None and p90_s is not None and top_s is not None  # noqa: PT018
    assert 0.005 <= median_s < 0.1 <= top_s
    assert gpu.clock_set_latency_s() == median_s
    assert median_s < p90_s < top_s


def test_clock_set_latency_is_the_recent_median_call(owner: GpuOwner) -> None:
    assert owner.clock_set_latency_s() is None
    for clock_mhz in (900, 1200, 1395):
        owner.set_locked_sm_clock_mhz(clock_mhz).result(timeout=5)
    latency_s = owner.clock_set_latency_s()
    assert latency_s is not None
    assert latency_s >= SET_CALL_S

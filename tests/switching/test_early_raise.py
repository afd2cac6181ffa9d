"""Raising a clock before the running computation ends: the deadline timer thread, the plan's scheduling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from perseus_client.protocol import PlanEntry

from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.registry import GpuRegistry
from perseusd.gpu.sim import SimBackend
from perseusd.jobs.lock_latency import job_latency_s
from perseusd.switching.deadline_timer import DeadlineTimer
from perseusd.switching.early_changes import EarlyRaise
from perseusd.switching.gpu_plan import MAX_EVENT_AGE_NS, GpuPlan
from perseusd.switching.plan_entries import computation_key, run_ends
from perseusd.switching.plans import PlanBook
from tests.daemon.test_plans import CLOCKS_MHZ, PLAN, ManualOwner

pytestmark = pytest.mark.timeout(30)

TIMES_S = (0.010, 0.020, 0.030, 0.040)  # F0 at 1410, F1 at 1005, B0 at 1005, B1 at 1410
LEAD_NS = 2_000_000
F0, F1, B0, B1 = (computation_key(e.instruction, e.microbatch, e.chunk) for e in PLAN)


class ManualTimer(DeadlineTimer):
    """Records deadlines; the test fires them."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled: list[tuple[int, Callable[[], None]]] = []

    def call_at(self, deadline_ns: int, callback: Callable[[], None]) -> None:
        self.scheduled.append((deadline_ns, callback))

    def fire_all(self) -> None:
        scheduled, self.scheduled = self.scheduled, []
        for _, callback in scheduled:
            callback()


def _book(owner: ManualOwner, timer: ManualTimer) -> PlanBook:
    return PlanBook(owner.submit, early=EarlyRaise(timer, LEAD_NS))


def test_higher_next_clock_is_raised_lead_before_the_expected_end() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = _book(owner, timer)
    plan = book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S)
    owner.complete_all()
    for key in (F0, F1):  # 1410 -> 1005 and 1005 -> 1005: nothing to raise
        book.on_begin("GPU-a", key, time.perf_counter_ns(), time.monotonic_ns())
        assert timer.scheduled == []
        book.on_end("GPU-a", key, time.perf_counter_ns())
        owner.complete_all()
    begun_ns = time.monotonic_ns()
    book.on_begin("GPU-a", B0, time.perf_counter_ns(), begun_ns)  # 1005, next B1 at 1410
    [(deadline_ns, _)] = timer.scheduled
    assert plan.pace < 1.0  # F0 and F1 ended at once: much faster than profiled
    assert deadline_ns == begun_ns + int(TIMES_S[2] * 1e9 * plan.pace) - LEAD_NS
    assert owner.clocks() == [1410, 1005]
    timer.fire_all()
    assert owner.clocks() == [1410, 1005, 1410]  # raised while B0 still runs
    book.on_end("GPU-a", B0, time.perf_counter_ns())
    assert owner.clocks() == [1410, 1005, 1410]  # the end's change was already made
    owner.complete_all()
    book.on_begin("GPU-a", B1, time.perf_counter_ns(), time.monotonic_ns())
    stats = plan.stats()
    assert (stats.early_raises, stats.late, stats.clock_changes) == (1, 0, 3)


def test_raise_is_dropped_when_the_computation_ended_first() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = _book(owner, timer)
    plan = book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S)
    book.on_begin("GPU-a", B0, time.perf_counter_ns(), time.monotonic_ns())
    book.on_end("GPU-a", B0, time.perf_counter_ns())  # shorter than expected: the end raised it
    book.on_begin("GPU-a", B1, time.perf_counter_ns(), time.monotonic_ns())
    book.on_end("GPU-a", B1, time.perf_counter_ns())  # next F0 at 1410: nothing to change
    timer.fire_all()  # stale: an event arrived since it was scheduled
    assert plan.early_raises == 0
    assert owner.clocks() == [1410, 1005, 1410]  # start F0, then B0 (begin), then B1 (end of B0)


def test_raise_of_a_replaced_plan_is_dropped() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = _book(owner, timer)
    old = book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S)
    book.on_begin("GPU-a", B0, time.perf_counter_ns(), time.monotonic_ns())
    low = tuple(PlanEntry(e.instruction, e.microbatch, e.chunk, 810) for e in PLAN)
    book.set("GPU-a", low, CLOCKS_MHZ, TIMES_S)
    timer.fire_all()
    assert old.retired
    assert old.early_raises == 0
    assert owner.clocks()[-1] == 810


def test_no_times_no_early_raise() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = _book(owner, timer)
    book.set("GPU-a", PLAN, CLOCKS_MHZ)
    book.on_begin("GPU-a", B0, time.perf_counter_ns(), time.monotonic_ns())
    assert timer.scheduled == []
    with pytest.raises(ValueError, match="3 expected times for a plan of 4"):
        book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S[:3])


def _manual_plan(owner: ManualOwner, timer: ManualTimer, now: list[int]) -> GpuPlan:
    return GpuPlan(
        "GPU-a",
        [F0, F1, B0, B1],
        [e.freq_mhz for e in PLAN],
        owner.submit,
        times_s=TIMES_S,
        early=EarlyRaise(timer, LEAD_NS),
        clock_ns=lambda: now[0],
    )


def test_pace_follows_actual_durations() -> None:
    now = [10**12]
    owner, timer = ManualOwner(), ManualTimer()
    plan = _manual_plan(owner, timer, now)
    b0_ns = int(TIMES_S[2] * 1e9)
    for _ in range(40):  # B0 runs 1.5x its profiled time, every time
        plan.on_begin(B0, 0, now[0])
        now[0] += b0_ns * 3 // 2
        plan.on_end(B0, 0, now[0])
    assert plan.pace == pytest.approx(1.5, rel=0.01)
    timer.scheduled.clear()
    plan.on_begin(B0, 0, now[0])
    [(deadline_ns, _)] = timer.scheduled
    assert deadline_ns == now[0] + int(b0_ns * plan.pace) - LEAD_NS
    before = plan.pace
    now[0] += 1000 * b0_ns
    plan.on_end(B0, 0, now[0])  # a stall: one sample, clamped to 4x
    assert plan.pace == pytest.approx(before + 0.1 * (4.0 - before))
    before = plan.pace
    plan.on_begin(F0, 0, now[0])
    now[0] += b0_ns
    plan.on_end(F1, 0, now[0])  # not the computation that began: no sample
    assert plan.pace == before


@pytest.mark.parametrize(
    ("offset_ns", "started_offset_ns"),
    [(5_000_000_000, 0), (-10 * MAX_EVENT_AGE_NS, -MAX_EVENT_AGE_NS), (-3_000_000, -3_000_000)],
    ids=["future", "too-old", "trusted"],
)
def test_sender_timestamp_is_clamped(offset_ns: int, started_offset_ns: int) -> None:
    now_ns = 10**12
    owner, timer = ManualOwner(), ManualTimer()
    plan = _manual_plan(owner, timer, [now_ns])
    plan.on_begin(B0, 0, now_ns + offset_ns)
    [(deadline_ns, _)] = timer.scheduled
    assert deadline_ns == now_ns + started_offset_ns + int(TIMES_S[2] * 1e9) - LEAD_NS


def test_timer_runs_callbacks_in_deadline_order_never_early() -> None:
    timer = DeadlineTimer()
    timer.start()
    fired: list[tuple[str, int]] = []
    done = threading.Event()
    try:
        base_ns = time.monotonic_ns()
        deadlines = {"c": base_ns + 60_000_000, "a": base_ns + 20_000_000, "b": base_ns + 40_000_000}
        for name, deadline_ns in deadlines.items():
            timer.call_at(deadline_ns, lambda name=name: fired.append((name, time.monotonic_ns())))
        timer.call_at(base_ns + 80_000_000, done.set)
        assert done.wait(10)
    finally:
        timer.stop()
    assert [name for name, _ in fired] == ["a", "b", "c"]
    for name, fired_ns in fired:
        assert fired_ns >= deadlines[name]
    assert timer.fired == 4


def test_timer_survives_a_failing_callback_and_drops_pending_on_stop() -> None:
    timer = DeadlineTimer()
    timer.start()
    done = threading.Event()
    late: list[int] = []

    def fail() -> None:
        raise RuntimeError("boom")

    now_ns = time.monotonic_ns()
    timer.call_at(now_ns - 1, fail)  # already due: runs at once
    timer.call_at(now_ns + 1_000_000, done.set)
    assert done.wait(10)
    timer.call_at(time.monotonic_ns() + 60 * 10**9, lambda: late.append(1))
    assert timer.pending() == 1
    timer.stop()
    assert (timer.fired, timer.failed, late, timer.pending()) == (1, 1, [], 0)
    timer.call_at(0, lambda: late.append(2))  # after stop: ignored
    assert timer.pending() == 0


def test_lead_is_the_measured_clock_set_latency_plus_the_margin() -> None:
    """On an H100 a lock blocks ~12 ms: the raise is submitted that much earlier than on a fast GPU."""
    now_ns = 10**12
    owner, timer = ManualOwner(), ManualTimer()
    measured: dict[str, int | None] = {"GPU-a": None}
    plan = GpuPlan(
        "GPU-a",
        [F0, F1, B0, B1],
        [e.freq_mhz for e in PLAN],
        owner.submit,
        times_s=TIMES_S,
        early=EarlyRaise(timer, LEAD_NS, measured.get),
        clock_ns=lambda: now_ns,
    )
    plan.on_begin(B0, 0, now_ns)  # unmeasured: the margin alone
    assert timer.scheduled[-1][0] == now_ns + int(TIMES_S[2] * 1e9) - LEAD_NS
    measured["GPU-a"] = 12_000_000
    plan.on_end(B0, 0, now_ns)
    plan.on_begin(B0, 0, now_ns)
    assert timer.scheduled[-1][0] == now_ns + int(TIMES_S[2] * 1e9 * plan.pace) - LEAD_NS - 12_000_000


def test_registry_gives_each_gpus_measured_clock_set_latency(tmp_path: Path) -> None:
    backend = SimBackend(tmp_path, noise=0.0, gpus=2)
    slow, fast = backend.sim_devices()
    slow.inject_fault("set_locked_sm_clock_mhz", "slow", delay_s=0.01)
    owners = [GpuOwner(device) for device in (slow, fast)]
    registry = GpuRegistry(owners, call_timeout_s=5.0)
    for owner in owners:
        owner.start()
    try:
        assert registry.clock_set_latency_ns(slow.info.uuid) is None
        assert registry.clock_set_latency_ns("GPU-none") is None
        for clock_mhz in (900, 1005, 1200):
            registry.set_locked_sm_clock_mhz(slow.info.uuid, clock_mhz)
            registry.set_locked_sm_clock_mhz(fast.info.uuid, clock_mhz)
        slow_ns = registry.clock_set_latency_ns(slow.info.uuid)
        fast_ns = registry.clock_set_latency_ns(fast.info.uuid)
        assert slow_ns is not None
        assert fast_ns is not None
        assert slow_ns >= 10_000_000 > fast_ns
        assert registry.clock_set_latencies_s("GPU-none") == ()
        slow_s, fast_s = (registry.clock_set_latencies_s(gpu.info.uuid) for gpu in (slow, fast))
        assert len(slow_s) == len(fast_s) == 3
        assert min(slow_s) >= 0.01 > max(fast_s)
        latency_s = job_latency_s([slow_s, fast_s])  # the slow GPU's lower quartile, over the pooled median
        assert latency_s is not None
        assert latency_s >= 0.01
    finally:
        registry.stop()
        backend.close()


def test_run_ends() -> None:
    clocks = [1005, 1005, 1410, 1410, 1005]
    left_ns, after_mhz, last_ns = run_ends(clocks, [10, 20, 30, 40, 50])
    assert left_ns == [30, 20, 70, 40, 80]  # the last 1005 runs on into the next iteration's first two
    assert after_mhz == [1410, 1410, 1005, 1005, 1410]
    assert last_ns == [20, 20, 40, 40, 20]
    assert run_ends([900, 900], [1, 2]) == ([0, 0], [900, 900], [0, 0])


def test_a_raise_is_scheduled_from_the_computation_where_its_deadline_falls() -> None:
    """The run before a raise is a long computation then a 1 ms one: the raise is asked for during the long
    one, `lead` before the run ends, not at the short one's begin (too late on an H100)."""
    now_ns = 10**12
    owner, timer = ManualOwner(), ManualTimer()
    clocks = [1005, 1005, 1410, 1410]
    plan = GpuPlan(
        "GPU-a",
        [F0, F1, B0, B1],
        clocks,
        owner.submit,
        times_s=(0.030, 0.001, 0.010, 0.010),
        early=EarlyRaise(timer, LEAD_NS, lambda _gpu: 12_000_000),
        clock_ns=lambda: now_ns,
    )
    plan.on_begin(F0, 0, now_ns)
    [(deadline_ns, _)] = timer.scheduled
    assert deadline_ns == now_ns + 31_000_000 - LEAD_NS - 12_000_000
    plan.on_end(F0, 0, now_ns)
    timer.scheduled.clear()
    plan.on_begin(B0, 0, now_ns)  # 1410, then B1 at 1410 and F0 at 1005: nothing to raise
    plan.on_begin(B1, 0, now_ns)
    assert timer.scheduled == []


def test_a_raise_waits_for_a_last_computation_that_outlasts_the_latency() -> None:
    """The run before a raise is a 15 ms computation and a 13 ms one: `lead` (12 + 2 ms) before the run ends
    falls 1 ms before the second begins, where the raise could act before it begins. The second outlasts the
    median latency (11 ms), so the raise waits for its begin; a 10 ms second computation does not."""
    now_ns = 10**12
    clocks = [1005, 1005, 1410, 1410]
    for second_s, at_first in ((0.013, False), (0.010, True)):
        owner, timer = ManualOwner(), ManualTimer()
        plan = GpuPlan(
            "GPU-a",
            [F0, F1, B0, B1],
            clocks,
            owner.submit,
            times_s=(0.015, second_s, 0.010, 0.010),
            early=EarlyRaise(timer, LEAD_NS, lambda _gpu: 12_000_000, lambda _gpu: 11_000_000),
            clock_ns=lambda: now_ns,
        )
        plan.on_begin(F0, 0, now_ns)
        assert bool(timer.scheduled) is at_first
        if at_first:
            [(deadline_ns, _)] = timer.scheduled
            assert deadline_ns == now_ns + int((0.015 + second_s) * 1e9) - LEAD_NS - 12_000_000
            continue
        plan.on_end(F0, 0, now_ns)
        plan.on_begin(F1, 0, now_ns + 15_000_000)
        [(deadline_ns, _)] = timer.scheduled
        assert deadline_ns <= now_ns + 15_000_000  # at once: the second computation's begin


def test_no_median_latency_never_holds_a_raise() -> None:
    """Unmeasured (or no median given): the raise is scheduled where its deadline falls, as before."""
    now_ns = 10**12
    owner, timer = ManualOwner(), ManualTimer()
    plan = GpuPlan(
        "GPU-a",
        [F0, F1, B0, B1],
        [1005, 1005, 1410, 1410],
        owner.submit,
        times_s=(0.015, 0.013, 0.010, 0.010),
        early=EarlyRaise(timer, LEAD_NS, lambda _gpu: 12_000_000, lambda _gpu: None),
        clock_ns=lambda: now_ns,
    )
    plan.on_begin(F0, 0, now_ns)
    [(deadline_ns, _)] = timer.scheduled
    assert deadline_ns == now_ns + 28_000_000 - LEAD_NS - 12_000_000

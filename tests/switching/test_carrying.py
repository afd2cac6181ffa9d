"""Which events of a plan a client may carry: never one the plan acts on when it arrives."""

from __future__ import annotations

import time

from perseus_client.protocol import PlanEntry

from perseusd.switching.carrying import RAISE_MARGIN, carried_events
from perseusd.switching.gpu_plan import GpuPlan
from perseusd.switching.plan_entries import run_ends
from perseusd.switching.plans import PlanBook
from tests.daemon.test_plans import CLOCKS_MHZ, PLAN, ManualOwner
from tests.switching.test_early_raise import F0, F1

MS = 1_000_000


def _carried(
    clocks: list[int], times_ms: list[float], lead_ms: float, lowers_early: bool
) -> list[tuple[bool, bool]]:
    times_ns = [int(t * MS) for t in times_ms]
    left_ns, after_mhz, _ = run_ends(clocks, times_ns)
    return carried_events(
        clocks, times_ns, left_ns, after_mhz, lead_ns=int(lead_ms * MS), lowers_early=lowers_early
    )


def test_one_clock_carries_every_computation_event() -> None:
    assert _carried([1400] * 4, [10.0] * 4, 5.0, True) == [(True, True)] * 4


def test_the_events_at_a_change_are_sent_at_once() -> None:
    # F F F F at 1980, B B B B at 1200 (cyclic: the last B's end raises to 1980 for the next iteration)
    flags = _carried([1980] * 4 + [1200] * 4, [5.0] * 8, 1.0, True)
    assert [end for _, end in flags] == [True, True, True, False, True, True, True, False]
    begins = [begin for begin, _ in flags]
    assert begins[0] is False  # after a lower clock: its begin catches the clock up
    assert begins[3] is False  # the next is lower and the plan lowers early: scheduled at this begin
    assert begins[4] is False  # after a higher clock
    assert begins[1:3] == [True, True]


def test_a_raise_that_may_fall_in_a_computation_keeps_its_begin() -> None:
    clocks = [1200] * 4 + [1980] * 4
    lead_ms = 4.0
    flags = _carried(clocks, [5.0] * 8, lead_ms, False)
    # The low run's raise falls lead before its end: in its last computation, and within RAISE_MARGIN leads
    # of the one before it, so both begins are sent at once; earlier ones are far from it.
    margin_ms = RAISE_MARGIN * lead_ms
    for i in range(1, 4):
        time_after_ms = 5.0 * (3 - i)
        assert flags[i][0] is (time_after_ms >= margin_ms), i
    assert [begin for begin, _ in flags[:4]] == [False, True, False, False]


def test_without_times_only_the_clock_changes_matter() -> None:
    clocks = [1200, 1200, 1980, 1980]
    left_ns, after_mhz, _ = run_ends(clocks, [])
    flags = carried_events(clocks, [], left_ns, after_mhz, lead_ns=10 * MS, lowers_early=True)
    assert flags == [(False, True), (True, False), (False, True), (True, False)]


def test_a_gpu_plan_names_its_carried_computations() -> None:
    entries = [PlanEntry("forward", mb, 0, 1980) for mb in range(3)] + [PlanEntry("backward", 0, 0, 1200)]
    plan = GpuPlan(
        "GPU-0",
        [(e.instruction, e.microbatch, e.chunk) for e in entries],
        [e.freq_mhz for e in entries],
        lambda _g, _c: None,
    )  # type: ignore[arg-type,return-value]
    carried = {(c.instruction.value, c.microbatch): (c.begin, c.end) for c in plan.carried()}
    assert carried == {
        ("forward", 0): (False, True),
        ("forward", 1): (True, True),
        ("forward", 2): (True, False),
    }


def test_a_begin_is_judged_by_the_clock_in_force_when_it_began() -> None:
    """A carried begin arrives after clocks applied since it began: it is late only if it began before its
    clock was applied, however late it arrives."""
    owner = ManualOwner()
    book = PlanBook(owner.submit)
    before_ns = time.monotonic_ns()  # F0 begins before its clock is even submitted
    plan = book.set("GPU-a", PLAN, CLOCKS_MHZ)
    owner.complete_all()  # 1410 applied after F0 began
    book.on_begin("GPU-a", F0, time.perf_counter_ns(), before_ns)
    assert plan.late == 1
    book.on_end("GPU-a", F0, time.perf_counter_ns(), time.monotonic_ns())
    owner.complete_all()  # 1005, for F1
    began_ns = time.monotonic_ns()
    plan.ensure(
        1410, time.perf_counter_ns()
    )  # an early raise for B1 (the timer's), applied before F1's begin
    owner.complete_all()  # arrives: F1 began at 1005, its clock
    book.on_begin("GPU-a", F1, time.perf_counter_ns(), began_ns)
    assert plan.late == 1

"""Per-computation clock plans without sockets: switching on end, late begins, skips, drop on release."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from perseus_client.protocol import (
    Claim,
    ClearPlan,
    ClearPlanOk,
    ComputationBegin,
    ComputationEnd,
    ErrorCode,
    Hello,
    PlanEntry,
    ProtocolError,
    Release,
    SetPlan,
    SetPlanOk,
)

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.deferred import resolved
from perseusd.daemon.wire_errors import protocol_error
from perseusd.errors import InvalidValueError
from perseusd.leasing.identity import Caller
from perseusd.switching.plan_entries import validate_plan
from perseusd.switching.plans import PlanBook
from tests.support.daemon_core import claim, sim_core
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(30)

CLOCKS_MHZ = (1410, 1200, 1005, 810)
PLAN = (
    PlanEntry("forward", 0, 0, 1410),
    PlanEntry("forward", 1, 0, 1005),
    PlanEntry("backward", 0, 0, 1005),
    PlanEntry("backward", 1, 0, 1410),
)


class ManualOwner:
    """Records submissions; the test completes them."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, Future[int]]] = []

    def submit(self, _gpu: str, clock_mhz: int) -> Future[int]:
        future: Future[int] = Future()
        self.submitted.append((clock_mhz, future))
        return future

    def complete_all(self) -> None:
        for clock_mhz, future in self.submitted:
            if not future.done():
                future.set_result(clock_mhz)

    def clocks(self) -> list[int]:
        return [clock for clock, _ in self.submitted]


def test_first_clock_submitted_then_next_on_each_end() -> None:
    owner = ManualOwner()
    book = PlanBook(owner.submit)
    book.set("GPU-a", PLAN, CLOCKS_MHZ)
    assert owner.clocks() == [1410]
    owner.complete_all()
    book.on_begin("GPU-a", ("forward", 0, 0), time.perf_counter_ns())
    book.on_end("GPU-a", ("forward", 0, 0), time.perf_counter_ns())
    assert owner.clocks() == [1410, 1005]  # the next computation's clock, submitted on the end
    owner.complete_all()
    book.on_begin("GPU-a", ("forward", 1, 0), time.perf_counter_ns())
    book.on_end("GPU-a", ("forward", 1, 0), time.perf_counter_ns())  # next is also 1005: skipped
    book.on_begin("GPU-a", ("backward", 0, 0), time.perf_counter_ns())
    book.on_end("GPU-a", ("backward", 0, 0), time.perf_counter_ns())
    owner.complete_all()
    book.on_begin("GPU-a", ("backward", 1, 0), time.perf_counter_ns())
    book.on_end("GPU-a", ("backward", 1, 0), time.perf_counter_ns())  # wraps to forward 0 (1410)
    assert owner.clocks() == [1410, 1005, 1410]
    stats = book.stats("GPU-a")
    assert stats is not None
    assert stats.computations == 4
    assert stats.clock_changes == 3
    assert stats.late == 0
    assert stats.skipped >= 1
    assert stats.event_to_clock_p99_ms is not None
    assert stats.event_to_clock_p99_ms >= 0


def test_begin_before_clock_applied_is_late_and_submits_it() -> None:
    owner = ManualOwner()
    book = PlanBook(owner.submit)
    book.set("GPU-a", PLAN, CLOCKS_MHZ)
    book.on_begin("GPU-a", ("forward", 0, 0), time.perf_counter_ns())  # 1410 still in flight
    stats = book.stats("GPU-a")
    assert stats is not None
    assert stats.late == 1
    book.on_begin("GPU-a", ("forward", 7, 0), time.perf_counter_ns())
    assert book.stats("GPU-a").unplanned == 1  # type: ignore[union-attr]


def test_failed_change_counted_and_resubmitted() -> None:
    owner = ManualOwner()
    book = PlanBook(owner.submit)
    book.set("GPU-a", PLAN, CLOCKS_MHZ)
    owner.submitted[0][1].set_exception(RuntimeError("GPU lost"))
    assert book.stats("GPU-a").errors == 1  # type: ignore[union-attr]
    book.on_begin("GPU-a", ("forward", 0, 0), time.perf_counter_ns())
    assert owner.clocks() == [1410, 1410]  # not skipped: the failed one is unknown


@pytest.mark.parametrize(
    ("plan", "reason"),
    [
        ((), "empty"),
        ((PlanEntry("forward", 0, 0, 1410), PlanEntry("forward", 0, 0, 810)), "twice"),
        ((PlanEntry("forward", -1, 0, 1410),), ">= 0"),
        ((PlanEntry("forward", 0, 0, 5000),), "outside"),
        ((PlanEntry("forward", 0, 0, 0),), "outside"),
    ],
)
def test_bad_plans_refused(plan: tuple[PlanEntry, ...], reason: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_plan(plan, CLOCKS_MHZ)
    wire = protocol_error(info.value, "set_plan")  # as the daemon answers a set_plan request
    assert wire is not None
    assert wire.code == ErrorCode.BAD_FIELD
    assert reason in wire.message
    assert wire.message.startswith("set_plan.plan")


def test_clocks_snapped_to_supported() -> None:
    assert validate_plan((PlanEntry("forward", 0, 0, 1190),), CLOCKS_MHZ) == [1200]


@pytest.fixture
def core(tmp_path: Path) -> Iterator[DaemonCore]:
    with sim_core(tmp_path, gpus=1) as daemon_core:
        yield daemon_core


def _wait_locked(core: DaemonCore, gpu: str, clock_mhz: int) -> None:
    locked = lambda: core.registry.read_all()[gpu].locked_sm_clock_mhz == clock_mhz  # noqa: E731
    wait_until(locked, 5, f"the clock to become {clock_mhz}", poll_s=0.001)


def test_core_switches_clock_on_events_and_drops_plan_on_release(core: DaemonCore) -> None:
    me = Caller(0, 0, os.getpid())
    gpu = core.registry.uuids[0]
    clocks = core.registry.info(gpu).supported_sm_clocks_mhz
    high, low = clocks[0], clocks[20]
    plan = (PlanEntry("forward", 0, 0, high), PlanEntry("forward", 1, 0, low))
    core.handle(me, Hello(job="j", client_version="t"))
    with pytest.raises(ProtocolError) as info:
        core.handle(me, SetPlan(gpu=gpu, plan=plan))
    assert info.value.code == ErrorCode.NOT_LEASED
    core.handle(me, Claim(gpus=(gpu,), job="j"))
    assert core.handle(me, SetPlan(gpu=gpu, plan=plan)) == SetPlanOk(gpu=gpu, computations=2)
    _wait_locked(core, gpu, high)
    core.on_event(me, ComputationBegin(gpu, 0, "forward", 0, 0, time.monotonic_ns()))
    core.on_event(me, ComputationEnd(gpu, 0, "forward", 0, 0, 0))
    _wait_locked(core, gpu, low)  # switched on the end, before the next begin
    core.on_event(me, ComputationBegin(gpu, 0, "forward", 1, 0, time.monotonic_ns()))
    core.on_event(me, ComputationEnd(gpu, 0, "forward", 1, 0, 0))
    _wait_locked(core, gpu, high)
    row = resolved(core.status(me, admin=True)).gpus[0]
    assert row.plan is not None
    assert row.plan.clock_changes == 3
    assert row.plan.late == 0
    core.handle(me, Release(gpus=(gpu,)))
    assert resolved(core.status(me, admin=True)).gpus[0].plan is None
    core.handle(me, Claim(gpus=(gpu,), job="j"))
    assert core.handle(me, ClearPlan(gpu=gpu)) == ClearPlanOk(gpu=gpu, cleared=False)


def test_client_death_drops_plan(core: DaemonCore) -> None:
    me = Caller(0, 0, os.getpid())
    gpu = core.registry.uuids[0]
    claim(core, me, (gpu,), "j")
    core.handle(me, SetPlan(gpu=gpu, plan=(PlanEntry("forward", 0, 0, 1200),)))
    assert core.plans.get(gpu) is not None
    core.client_died(os.getpid())
    assert core.plans.get(gpu) is None

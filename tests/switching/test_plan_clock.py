"""A plan's one clock (CLOCK_MONOTONIC, injected) and its locking."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
from perseus_client.protocol import PlanEntry

from perseusd.switching.plan_entries import computation_key
from perseusd.switching.plans import PlanBook
from tests.daemon.test_plans import CLOCKS_MHZ, PLAN, ManualOwner

pytestmark = pytest.mark.timeout(30)

F0 = computation_key("forward", 0, 0)
F1 = computation_key("forward", 1, 0)


def test_the_injected_clock_times_the_event_to_clock_latency() -> None:
    now_ns = [5_000_000_000]
    owner = ManualOwner()
    book = PlanBook(owner.submit, clock_ns=lambda: now_ns[0])
    book.set("GPU-a", PLAN, CLOCKS_MHZ)
    assert book.now_ns() == now_ns[0]
    owner.complete_all()
    book.on_end("GPU-a", F0, book.now_ns(), now_ns[0])  # F1 is planned at 1005: one submit
    now_ns[0] += 7_000_000  # the owner applies it 7 ms (on the plan's clock) after the event
    owner.complete_all()
    stats = book.stats("GPU-a")
    assert stats is not None
    # the first clock applied at once (0 ms), this one 7 ms later: both read on the injected clock
    assert (stats.event_to_clock_p50_ms, stats.event_to_clock_p99_ms) == (3.5, 7.0)


def test_a_submit_that_fails_at_once_neither_deadlocks_nor_sticks() -> None:
    """A stopped owner completes the future inside `submit`: the callback runs on the event thread while it
    holds the plan's move lock, and must forget the requested clock (so the next change is submitted)."""

    def failing_submit(_gpu: str, _clock_mhz: int) -> Future[int]:
        future: Future[int] = Future()
        future.set_exception(RuntimeError("owner stopped"))
        return future

    book = PlanBook(failing_submit)
    done = threading.Event()

    def events() -> None:
        book.set("GPU-a", (PlanEntry("forward", 0, 0, 1410), PlanEntry("forward", 1, 0, 1005)), CLOCKS_MHZ)
        book.on_end("GPU-a", F0, book.now_ns(), None)
        book.on_end("GPU-a", F0, book.now_ns(), None)
        done.set()

    thread = threading.Thread(target=events, daemon=True)
    thread.start()
    assert done.wait(10), "the plan deadlocked on its own lock"
    stats = book.stats("GPU-a")
    assert stats is not None
    assert (stats.errors, stats.clock_changes, stats.skipped) == (3, 3, 0)

"""One thread that runs short callbacks at CLOCK_MONOTONIC deadlines (ns), earliest first.

Used to raise a GPU's clock just before a computation is expected to end, so that the next computation,
planned at a higher clock, does not begin at the lower one. Callbacks run on the timer thread and must not
block: they only submit work to a GPU's owner thread. A failing callback is logged and the timer goes on.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

Callback = Callable[[], None]


class DeadlineTimer:
    """A heap of (deadline_ns, callback) served by one daemon thread."""

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._heap: list[tuple[int, int, Callback]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.fired = 0
        self.failed = 0

    def start(self) -> None:
        with self._wake:
            if self._thread is not None:
                return
            self._thread = NamedThread(target=self._loop, name="deadline-timer", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread; callbacks not yet due are dropped."""
        with self._wake:
            self._stopped = True
            self._heap.clear()
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def call_at(self, deadline_ns: int, callback: Callback) -> None:
        """Run `callback` on the timer thread at `deadline_ns` (at once when it has passed)."""
        with self._wake:
            if self._stopped:
                return
            heapq.heappush(self._heap, (deadline_ns, next(self._order), callback))
            if self._heap[0][2] is callback:
                self._wake.notify()

    def pending(self) -> int:
        with self._wake:
            return len(self._heap)

    def _loop(self) -> None:
        while True:
            callback = self._next_due()
            if callback is None:
                return
            try:
                callback()
                self.fired += 1
            except Exception:
                self.failed += 1
                logger.exception("deadline timer callback failed")

    def _next_due(self) -> Callback | None:
        """Wait for the earliest deadline and pop its callback; None once stopped."""
        with self._wake:
            while not self._stopped:
                if not self._heap:
                    self._wake.wait()
                    continue
                wait_ns = self._heap[0][0] - self._clock_ns()
                if wait_ns <= 0:
                    return heapq.heappop(self._heap)[2]
                self._wake.wait(wait_ns / 1e9)
            return None

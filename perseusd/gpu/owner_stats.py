"""The owner thread's call counters: every device call of a `GpuOwner` (`perseusd.gpu.owner`) is timed here.

Per operation: calls, skipped, superseded, errors, total_s, max_s, last_s (`GpuOwner.stats()`); the durations
of the last `LATENCY_WINDOW` clock sets that succeeded, what a clock change takes to act
(`GpuOwner.clock_set_latency_s()`); and when the call running now began, which `GpuOwner.healthy()` holds
against its `call_timeout_s`. The counters are guarded by the owner's own lock, given at construction, so that
the owner counts a superseded clock set in the same locked step that supersedes it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
_STAT_FIELDS = ("calls", "skipped", "superseded", "errors", "total_s", "max_s", "last_s")
SET_CLOCK = "set_locked_sm_clock_mhz"
"""The clock-set operation: its durations are kept for `CallStats.clock_set_latencies_s()`."""
LATENCY_WINDOW = 32
"""Clock-set call durations kept (the most recent) for `GpuOwner.clock_set_latency_s()`."""


def latency_quantile_s(samples_s: Iterable[float], quantile: float = 0.5) -> float | None:
    """The `quantile` of clock-set call durations (s; linear between samples); None without any."""
    ordered = sorted(samples_s)
    if not ordered:
        return None
    position = quantile * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


class CallStats:
    """One GPU owner's device calls: timed, counted per operation, under the owner's `lock`."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._stats: dict[str, dict[str, float]] = {}
        self._set_clock_s: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.call_started_s: float | None = None
        """When the device call running now began (`time.monotonic()`); None between calls."""

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, skipped, superseded, errors, total_s, max_s, last_s (a copy)."""
        with self._lock:
            return {op: dict(values) for op, values in self._stats.items()}

    def clock_set_latencies_s(self) -> tuple[float, ...]:
        """The durations of the last `LATENCY_WINDOW` clock-set calls (s), oldest first."""
        with self._lock:
            return tuple(self._set_clock_s)

    def call(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """One timed device call."""
        started_s = time.monotonic()
        self.call_started_s = started_s
        failed = True
        try:
            result = fn(*args)
            failed = False
            return result
        finally:
            self.call_started_s = None
            self._record(op, time.monotonic() - started_s, failed)

    def skip(self, op: str) -> None:
        """Count a call of `op` left out because the GPU is known to be in the state it asks for."""
        with self._lock:
            (self._stats.get(op) or self._new_stats(op))["skipped"] += 1

    def count_superseded(self) -> None:
        """Count a clock set that a waiting one took over (call with the lock held)."""
        (self._stats.get(SET_CLOCK) or self._new_stats(SET_CLOCK))["superseded"] += 1

    def _record(self, op: str, elapsed_s: float, failed: bool) -> None:
        with self._lock:
            values = self._stats.get(op) or self._new_stats(op)
            values["calls"] += 1
            values["errors"] += int(failed)
            values["total_s"] += elapsed_s
            values["max_s"] = max(values["max_s"], elapsed_s)
            values["last_s"] = elapsed_s
            if op == SET_CLOCK and not failed:
                self._set_clock_s.append(elapsed_s)

    def _new_stats(self, op: str) -> dict[str, float]:
        """`op`'s counters, created at its first use (call with the lock held)."""
        values = self._stats[op] = dict.fromkeys(_STAT_FIELDS, 0.0)
        return values

"""Per-computation clock plans: on a computation's end, the next computation's clock is submitted at once.

No transport and no waiting: a clock change is submitted to the GPU's owner thread and a done-callback (run on
that thread) records the clock applied, the event -> applied latency and errors. Everything here is counted;
nothing is logged per event.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from perseus_client.protocol import ErrorCode, PlanEntry, PlanStats, ProtocolError

from perseusd.gpu.clocks import snap_clock_mhz

ComputationKey = tuple[str, int, int]  # (instruction, microbatch, chunk)
SubmitClock = Callable[[str, int], "Future[int]"]
LATENCY_SAMPLES = 10_000


def computation_key(instruction: str, microbatch: int, chunk: int) -> ComputationKey:
    return (instruction, microbatch, chunk)


def validate_plan(plan: Sequence[PlanEntry], supported_clocks_mhz: Sequence[int]) -> list[int]:
    """The plan's clocks snapped to supported clocks; raises `ProtocolError(BAD_FIELD)` on a bad plan."""
    if not plan:
        raise ProtocolError(ErrorCode.BAD_FIELD, "set_plan.plan: empty (use clear_plan)")
    low_mhz = min(supported_clocks_mhz, default=1)
    high_mhz = max(supported_clocks_mhz, default=1 << 20)
    seen: set[ComputationKey] = set()
    clocks_mhz: list[int] = []
    for i, entry in enumerate(plan):
        where = f"set_plan.plan[{i}]"
        if entry.microbatch < 0 or entry.chunk < 0:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: microbatch and chunk must be >= 0")
        if not low_mhz <= entry.freq_mhz <= high_mhz:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"{where}.freq_mhz: {entry.freq_mhz} outside {low_mhz}..{high_mhz} MHz"
            )
        key = computation_key(entry.instruction, entry.microbatch, entry.chunk)
        if key in seen:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: computation {key} listed twice")
        seen.add(key)
        clocks_mhz.append(
            snap_clock_mhz(supported_clocks_mhz, entry.freq_mhz) if supported_clocks_mhz else entry.freq_mhz
        )
    return clocks_mhz


class GpuPlan:
    """One GPU's plan: clock per computation, schedule order, counters and latency samples."""

    def __init__(
        self, gpu: str, keys: Sequence[ComputationKey], clocks_mhz: Sequence[int], submit: SubmitClock
    ) -> None:
        self.gpu = gpu
        self._order = tuple(keys)
        self._clock_mhz = dict(zip(keys, clocks_mhz, strict=True))
        self._position = {key: i for i, key in enumerate(keys)}
        self._submit = submit
        self._requested_mhz: int | None = None  # the last clock submitted
        self.applied_mhz: int | None = None  # the last clock the owner reported applied
        self.begins = 0
        self.clock_changes = 0
        self.skipped = 0
        self.late = 0
        self.unplanned = 0
        self.errors = 0
        self._latencies_ns: deque[int] = deque(maxlen=LATENCY_SAMPLES)
        self._lock = threading.Lock()

    @property
    def computations(self) -> int:
        return len(self._order)

    def start(self, received_ns: int) -> None:
        """Submit the first computation's clock so the first begin finds it applied."""
        self.ensure(self._clock_mhz[self._order[0]], received_ns)

    def forget_requested(self) -> None:
        """The clock was changed outside the plan (set_clock): submit the next change whatever it is."""
        self._requested_mhz = None

    def on_begin(self, key: ComputationKey, received_ns: int) -> None:
        clock_mhz = self._clock_mhz.get(key)
        if clock_mhz is None:
            self.unplanned += 1
            return
        self.begins += 1
        if self.applied_mhz != clock_mhz:
            self.late += 1
        self.ensure(clock_mhz, received_ns)

    def on_end(self, key: ComputationKey, received_ns: int) -> None:
        position = self._position.get(key)
        if position is None:
            return
        following = self._order[(position + 1) % len(self._order)]  # wraps to the next iteration
        self.ensure(self._clock_mhz[following], received_ns)

    def ensure(self, clock_mhz: int, received_ns: int) -> None:
        """Submit `clock_mhz` unless it is already the clock requested; never waits."""
        if self._requested_mhz == clock_mhz:
            self.skipped += 1
            return
        self._requested_mhz = clock_mhz
        self.clock_changes += 1
        future = self._submit(self.gpu, clock_mhz)
        future.add_done_callback(lambda done: self._applied(done, received_ns))

    def _applied(self, future: Future[int], received_ns: int) -> None:
        """Done-callback, on the owner thread (or here when the owner had stopped)."""
        if future.cancelled() or future.exception() is not None:
            self.errors += 1
            self._requested_mhz = None  # unknown: the next change is submitted whatever it is
            return
        elapsed_ns = time.perf_counter_ns() - received_ns
        with self._lock:
            self.applied_mhz = future.result()
            self._latencies_ns.append(elapsed_ns)

    def stats(self) -> PlanStats:
        with self._lock:
            samples_ms = [ns / 1e6 for ns in self._latencies_ns]
        return PlanStats(
            computations=self.computations,
            clock_changes=self.clock_changes,
            skipped=self.skipped,
            late=self.late,
            unplanned=self.unplanned,
            errors=self.errors,
            event_to_clock_p50_ms=_round(statistics.median(samples_ms)) if samples_ms else None,
            event_to_clock_p99_ms=_round(percentile(samples_ms, 0.99)) if samples_ms else None,
        )


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of non-empty `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _round(value_ms: float) -> float:
    return round(value_ms, 4)


class PlanBook:
    """The plans of leased GPUs, by UUID."""

    def __init__(self, submit: SubmitClock, clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._submit = submit
        self._clock_ns = clock_ns
        self._plans: dict[str, GpuPlan] = {}

    def set(self, gpu: str, plan: Sequence[PlanEntry], supported_clocks_mhz: Sequence[int]) -> GpuPlan:
        """Validate and install a plan (replacing any), and submit its first computation's clock."""
        clocks_mhz = validate_plan(plan, supported_clocks_mhz)
        keys = [computation_key(e.instruction, e.microbatch, e.chunk) for e in plan]
        gpu_plan = GpuPlan(gpu, keys, clocks_mhz, self._submit)
        self._plans[gpu] = gpu_plan
        gpu_plan.start(self._clock_ns())
        return gpu_plan

    def drop(self, gpu: str) -> bool:
        return self._plans.pop(gpu, None) is not None

    def clear(self) -> None:
        self._plans.clear()

    def get(self, gpu: str) -> GpuPlan | None:
        return self._plans.get(gpu)

    def stats(self, gpu: str) -> PlanStats | None:
        plan = self._plans.get(gpu)
        return None if plan is None else plan.stats()

    def on_begin(self, gpu: str, key: ComputationKey, received_ns: int) -> None:
        plan = self._plans.get(gpu)
        if plan is not None:
            plan.on_begin(key, received_ns)

    def on_end(self, gpu: str, key: ComputationKey, received_ns: int) -> None:
        plan = self._plans.get(gpu)
        if plan is not None:
            plan.on_end(key, received_ns)

"""Latency histogram and error codes of the calls each GPU owner thread makes to its device.

`TimedDevice` wraps a backend device (the composition root wraps every device before its owner thread starts),
so every NVML (or simulated) call is timed on the owner thread that makes it; nothing here runs on the event
path. `GpuCallRecorder` keeps cumulative histogram buckets per (GPU, operation) and failures per (GPU, code):
the NVML return code for NVML errors (e.g. "nvml_3"), else the exception's type name.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from perseusd.gpu.backend import GpuDevice, GpuInfo, GpuState
from perseusd.gpu.errors import GpuOperationError
from perseusd.gpu.power_features import PowerFeature

T = TypeVar("T")

# Upper bounds (seconds): a simulated call takes microseconds, an NVML read ~0.1-1 ms, a clock write ~1-10 ms.
CALL_BUCKETS_S: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


@dataclass(frozen=True)
class CallHistogram:
    """One (GPU, operation): counts per bucket (not cumulative; the last is +Inf), sum and count."""

    bucket_counts: tuple[int, ...]
    sum_s: float
    count: int


class GpuCallRecorder:
    """Thread-safe histogram and error counters, written by owner threads, read by the metrics collector."""

    def __init__(self, buckets_s: tuple[float, ...] = CALL_BUCKETS_S) -> None:
        self.buckets_s = buckets_s
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._sums_s: dict[tuple[str, str], float] = {}
        self._errors: Counter[tuple[str, str]] = Counter()

    def record(self, gpu: str, op: str, elapsed_s: float, error: BaseException | None) -> None:
        index = bisect.bisect_left(self.buckets_s, elapsed_s)
        key = (gpu, op)
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0] * (len(self.buckets_s) + 1)
            counts[index] += 1
            self._sums_s[key] = self._sums_s.get(key, 0.0) + elapsed_s
            if error is not None:
                self._errors[(gpu, error_code(error))] += 1

    def histograms(self) -> dict[tuple[str, str], CallHistogram]:
        """A copy per (GPU, operation)."""
        with self._lock:
            return {
                key: CallHistogram(tuple(counts), self._sums_s[key], sum(counts))
                for key, counts in self._counts.items()
            }

    def errors(self) -> dict[tuple[str, str], int]:
        """Failed calls per (GPU, code)."""
        with self._lock:
            return dict(self._errors)


def error_code(error: BaseException) -> str:
    """A stable label for a failed call: "nvml_<code>" when NVML gave one, else the exception's type name."""
    if isinstance(error, GpuOperationError) and error.nvml_code is not None:
        return f"nvml_{error.nvml_code}"
    return type(error).__name__


class TimedDevice(GpuDevice):
    """A device whose every call is timed into a `GpuCallRecorder` (on the calling owner thread)."""

    def __init__(self, device: GpuDevice, recorder: GpuCallRecorder) -> None:
        self._device = device
        self._recorder = recorder
        self._uuid = device.info.uuid

    @property
    def info(self) -> GpuInfo:
        return self._device.info

    def _timed(self, op: str, call: Callable[[], T]) -> T:
        started_s = time.perf_counter()
        try:
            result = call()
        except BaseException as exc:
            self._recorder.record(self._uuid, op, time.perf_counter() - started_s, exc)
            raise
        self._recorder.record(self._uuid, op, time.perf_counter() - started_s, None)
        return result

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        return self._timed("set_locked_sm_clock_mhz", lambda: self._device.set_locked_sm_clock_mhz(clock_mhz))

    def reset_locked_sm_clock(self) -> None:
        self._timed("reset_locked_sm_clock", self._device.reset_locked_sm_clock)

    def locked_sm_clock_mhz(self) -> int | None:
        return self._timed("locked_sm_clock_mhz", self._device.locked_sm_clock_mhz)

    def sm_clock_mhz(self) -> int:
        return self._timed("sm_clock_mhz", self._device.sm_clock_mhz)

    def set_power_limit_w(self, limit_w: float) -> float:
        return self._timed("set_power_limit_w", lambda: self._device.set_power_limit_w(limit_w))

    def power_features(self) -> tuple[PowerFeature, ...]:
        return self._device.power_features()

    def power_limit_w(self) -> float:
        return self._timed("power_limit_w", self._device.power_limit_w)

    def energy_mj(self) -> int:
        return self._timed("energy_mj", self._device.energy_mj)

    def power_w(self) -> float:
        return self._timed("power_w", self._device.power_w)

    def state(self) -> GpuState:
        return self._timed("state", self._device.state)

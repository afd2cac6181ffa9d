"""What NVML does not publish, measured: the energy counter update period and the clock-switch latency.

Used by `benchmarks/nvml_probe.py` and the real-GPU tests; they work on any `GpuDevice` (the sim included).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from perseusd.gpu.backend import GpuDevice


@dataclass(frozen=True)
class CounterPeriod:
    """How often the energy counter changed while polled."""

    reads: int
    changes: int
    median_period_s: float | None
    min_period_s: float | None
    max_period_s: float | None


@dataclass(frozen=True)
class ClockSwitch:
    """Time from a locked-clock request until the reported SM clock changed."""

    from_mhz: int
    to_mhz: int
    applied_mhz: int
    set_call_s: float
    latency_s: float | None
    """None when the clock did not reach `applied_mhz` before the timeout."""
    final_mhz: int


def energy_counter_period(
    device: GpuDevice,
    duration_s: float = 2.0,
    poll_s: float = 0.001,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> CounterPeriod:
    """Poll the energy counter for `duration_s` and report the intervals between its changes."""
    change_times_s: list[float] = []
    reads = 0
    last_mj = device.energy_mj()
    end_s = clock() + duration_s
    while (now_s := clock()) < end_s:
        value_mj = device.energy_mj()
        reads += 1
        if value_mj != last_mj:
            change_times_s.append(now_s)
            last_mj = value_mj
        sleep(poll_s)
    periods_s = [b - a for a, b in itertools.pairwise(change_times_s)]
    return CounterPeriod(
        reads=reads,
        changes=len(change_times_s),
        median_period_s=statistics.median(periods_s) if periods_s else None,
        min_period_s=min(periods_s) if periods_s else None,
        max_period_s=max(periods_s) if periods_s else None,
    )


def clock_switch_latency(
    device: GpuDevice,
    to_mhz: int,
    timeout_s: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
) -> ClockSwitch:
    """Lock the clock to `to_mhz`, then poll the SM clock until it reports the applied clock."""
    from_mhz = device.sm_clock_mhz()
    start_s = clock()
    applied_mhz = device.set_locked_sm_clock_mhz(to_mhz)
    set_done_s = clock()
    latency_s = None
    current_mhz = device.sm_clock_mhz()
    while clock() - start_s < timeout_s:
        if current_mhz == applied_mhz:
            latency_s = clock() - start_s
            break
        current_mhz = device.sm_clock_mhz()
    return ClockSwitch(from_mhz, to_mhz, applied_mhz, set_done_s - start_s, latency_s, current_mhz)

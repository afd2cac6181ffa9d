"""Is a GPU power-capped at its highest clock, and at which clock does it really run there?

While online profiling runs the highest clock, the daemon reads the GPU a few times during computations
(`CAPPING_READS`). A lock above the clock the power limit allows changes nothing but the label, so the sweep
may skip the clocks between (`perseusd.profiling.sweep`), but only when EVERY read found the GPU capped: a
computation that runs uncapped at the top clock (an H100's LM-head stage below ~1845 MHz) needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from perseusd.gpu.backend import power_capped
from perseusd.gpu.reading import GpuReading

CAPPING_READS = 8
"""GPU reads at the highest clock, while computations run, to see whether and where it is power-capped."""


def finished_readings(futures: Sequence[Future[GpuReading]]) -> list[GpuReading]:
    return [f.result() for f in futures if f.done() and not f.cancelled() and f.exception() is None]


def capped_clock_mhz(readings: Sequence[GpuReading]) -> int | None:
    """The highest clock read when every reading (with a clock and clock-event reasons) says power-capped;
    None when any says uncapped, or none could tell."""
    usable = [r for r in readings if r.sm_clock_mhz is not None and r.clock_event_reasons is not None]
    if not usable or not all(power_capped(r.clock_event_reasons or 0) for r in usable):
        return None
    return max(r.sm_clock_mhz or 0 for r in usable)

"""One reading of a GPU, what `GpuOwner.read()` gives (`perseusd.gpu.owner`): the daemon's status, metrics,
energy replies, power cap and pool all take their GPU values from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuReading:
    """One reading of a GPU; unavailable values are None and `error` says why."""

    uuid: str
    sm_clock_mhz: int | None
    locked_sm_clock_mhz: int | None
    power_w: float | None
    power_limit_w: float | None
    energy_mj: int | None
    error: str | None = None
    clock_event_reasons: int | None = None
    """NVML's clock-event reasons bitmask (`perseusd.gpu.backend.CLOCK_EVENT_*`), None: unavailable."""

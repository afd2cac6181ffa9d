"""Energy reading messages of the wire protocol: any connected user reads the energy counters of chosen GPUs
from the daemon (no NVML in the caller, no lease needed). `perseus_client.protocol` registers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import GpusMessage, Message


@dataclass(frozen=True)
class EnergyRead(GpusMessage, wire_type="energy_read"):
    """Read the energy counters of `gpus` (UUIDs; empty: every GPU of the node)."""


@dataclass(frozen=True)
class GpuEnergy:
    """One GPU's energy counter as the daemon read it."""

    uuid: str
    energy_j: float | None
    """The counter (J since the driver loaded); None when it could not be read (see `error`)."""
    read_ns: int
    """CLOCK_MONOTONIC time of the read (ns; the same clock as `time.monotonic_ns()` on this node)."""
    power_w: float | None
    """Instant power at the read (W), for the uncertainty of short windows."""
    counter_period_s: float
    """How often the counter advances: a value read may be this old (NVML: 20-100 ms, 0.1 assumed)."""
    error: str


@dataclass(frozen=True)
class EnergyReading(Message, wire_type="energy_reading"):
    gpus: tuple[GpuEnergy, ...]

"""Energy windows without privileges: measure the GPU energy of any stretch of code through the daemon.

    monitor = EnergyMonitor(client)            # or EnergyMonitor(client, gpus=[0, 1]) / [uuid, ...]
    monitor.begin_window("epoch")
    ...                                        # windows nest and overlap; any thread may open or close one
    m = monitor.end_window("epoch")
    print(m.time_s, m.total_energy_j, m.uncertainty_j)

The daemon reads the GPUs' energy counters (the training process needs no NVML access and no lease). A
counter advances only every `counter_period_s` (NVML: 20-100 ms, 100 ms is assumed; simulated GPUs: their
update period), so the value read at each end of a window may be up to one period old. The energy of a window
is therefore exact to within about one period of energy at each end: `uncertainty_j` is
`counter_period_s` x the higher of the two instant powers read, per GPU. A window much longer than the
period (seconds) is precise to a few percent or better; a window shorter than the period may show no energy
at all, and its `relative_uncertainty` says so (> 1). The time is measured in this process and is exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.energy_messages import EnergyRead, EnergyReading, GpuEnergy


@dataclass(frozen=True)
class Measurement:
    """One closed window: its duration and, per GPU (by UUID), energy and its uncertainty (J)."""

    name: str
    time_s: float
    energy_j: dict[str, float]
    uncertainty_j: dict[str, float]
    counter_period_s: float

    @property
    def total_energy_j(self) -> float:
        return sum(self.energy_j.values())

    @property
    def total_uncertainty_j(self) -> float:
        return sum(self.uncertainty_j.values())

    @property
    def relative_uncertainty(self) -> float:
        """Uncertainty over energy (inf when no energy was counted: the window is below the resolution)."""
        total = self.total_energy_j
        return self.total_uncertainty_j / total if total > 0 else float("inf")


@dataclass(frozen=True)
class _Open:
    began_ns: int
    readings: tuple[GpuEnergy, ...]


class EnergyMonitor:
    """Named energy windows over chosen GPUs, served by perseusd; safe to use from many threads.

    Args:
        client: a connected `PerseusClient` (its lock serialises the daemon calls).
        gpus: GPU UUIDs or indices into the daemon's GPU list; empty: every GPU of the node.
    """

    def __init__(self, client: PerseusClient, gpus: Sequence[str | int] = ()) -> None:
        self._client = client
        self.gpus = resolve_gpus(client, gpus)
        self._windows: dict[str, _Open] = {}
        self._lock = threading.Lock()

    def begin_window(self, name: str) -> None:
        """Open window `name`; raises `ValueError` if a window of that name is already open."""
        with self._lock:
            if name in self._windows:
                raise ValueError(f"energy window {name!r} is already open")
        readings = self._read()
        with self._lock:
            if name in self._windows:
                raise ValueError(f"energy window {name!r} is already open")
            self._windows[name] = _Open(time.monotonic_ns(), readings)

    def end_window(self, name: str) -> Measurement:
        """Close window `name` and return what it measured; raises `ValueError` if it is not open."""
        ended_ns = time.monotonic_ns()
        readings = self._read()
        with self._lock:
            opened = self._windows.pop(name, None)
        if opened is None:
            raise ValueError(f"energy window {name!r} is not open")
        return measurement(name, (ended_ns - opened.began_ns) / 1e9, opened.readings, readings)

    def cancel_window(self, name: str) -> None:
        with self._lock:
            self._windows.pop(name, None)

    def _read(self) -> tuple[GpuEnergy, ...]:
        reply = self._client._call(EnergyRead(gpus=self.gpus), EnergyReading)
        for gpu in reply.gpus:
            if gpu.energy_j is None:
                raise PerseusClientError("GPU_ERROR", f"energy of GPU {gpu.uuid} unavailable: {gpu.error}")
        return reply.gpus


def measurement(
    name: str, time_s: float, begin: Sequence[GpuEnergy], end: Sequence[GpuEnergy]
) -> Measurement:
    """The energy between two readings of the same GPUs (read without error), with its uncertainty from
    the counter period."""
    energy_j: dict[str, float] = {}
    uncertainty_j: dict[str, float] = {}
    period_s = 0.0
    for first, last in zip(begin, end, strict=True):
        energy_j[first.uuid] = max(0.0, (last.energy_j or 0.0) - (first.energy_j or 0.0))
        power_w = max(first.power_w or 0.0, last.power_w or 0.0)
        uncertainty_j[first.uuid] = last.counter_period_s * power_w
        period_s = max(period_s, last.counter_period_s)
    return Measurement(name, time_s, energy_j, uncertainty_j, period_s)


def resolve_gpus(client: PerseusClient, gpus: Sequence[str | int]) -> tuple[str, ...]:
    """UUIDs for `gpus` (UUIDs or indices into the daemon's list); empty: all of the node's GPUs."""
    info = client.daemon_info if client.daemon_info is not None else client.hello()
    if info is None:
        raise PerseusClientError("UNREACHABLE", "energy windows need the daemon, and it is out of reach")
    known = [gpu.uuid for gpu in info.gpus]
    if not gpus:
        return tuple(known)
    uuids = []
    for gpu in gpus:
        if isinstance(gpu, int):
            if not 0 <= gpu < len(known):
                raise ValueError(f"GPU index {gpu} out of range (the node has {len(known)} GPUs)")
            uuids.append(known[gpu])
        elif gpu in known:
            uuids.append(gpu)
        else:
            raise ValueError(f"no GPU {gpu!r} on this node")
    return tuple(dict.fromkeys(uuids))  # each GPU once: the daemon refuses a GPU named twice

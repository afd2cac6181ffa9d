"""The GPU registry: the daemon's GPUs by UUID, each behind its owner thread, with bounded waits."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TypeVar

from perseusd.errors import GpuError
from perseusd.gpu.backend import GpuInfo, GpuState
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.power_features import PowerFeature
from perseusd.gpu.reading import GpuReading

logger = logging.getLogger(__name__)

T = TypeVar("T")


class UnknownGpuError(GpuError):
    """No GPU with this UUID on this node."""


class GpuRegistry:
    """All GPUs of the node by UUID. Every call waits at most `call_timeout_s` for the owner thread."""

    def __init__(self, owners: Sequence[GpuOwner], call_timeout_s: float) -> None:
        self._owners: dict[str, GpuOwner] = {owner.info.uuid: owner for owner in owners}
        self._call_timeout_s = call_timeout_s
        self.power_features: dict[str, tuple[PowerFeature, ...]] = {}
        """The driver power features of each GPU that can fight its clocks, read at start."""

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(self._owners)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._owners

    def info(self, uuid: str) -> GpuInfo:
        return self._owner(uuid).info

    def infos(self) -> tuple[GpuInfo, ...]:
        return tuple(owner.info for owner in self._owners.values())

    @property
    def call_timeout_s(self) -> float:
        return self._call_timeout_s

    def set_call_timeout_s(self, call_timeout_s: float) -> None:
        self._call_timeout_s = call_timeout_s

    def set_locked_sm_clock_mhz(self, uuid: str, clock_mhz: int | None) -> int | None:
        """Lock the SM clock (None unlocks); returns the clock applied (MHz) or None."""
        owner = self._owner(uuid)
        if clock_mhz is None:
            self._wait(uuid, owner.reset_locked_sm_clock())
            return None
        return self._wait(uuid, owner.set_locked_sm_clock_mhz(clock_mhz))

    def submit_locked_sm_clock_mhz(self, uuid: str, clock_mhz: int) -> Future[int]:
        """Lock the SM clock without waiting: the Future gives the clock applied (MHz)."""
        return self._owner(uuid).set_locked_sm_clock_mhz(clock_mhz)

    def submit_read(self, uuid: str) -> Future[GpuReading]:
        """Read the GPU without waiting (clocks, clock-event reasons, power, energy)."""
        return self._owner(uuid).read()

    def clock_set_latencies_s(self, uuid: str) -> tuple[float, ...]:
        """The GPU's recent clock-set call durations (s, oldest first; none for an unknown GPU)."""
        owner = self._owners.get(uuid)
        return () if owner is None else owner.clock_set_latencies_s()

    def clock_set_latency_ns(self, uuid: str, quantile: float = 0.5) -> int | None:
        """The GPU's measured clock-set latency (that quantile of its recent set calls, the median by
        default, ns); None before the first or for an unknown GPU."""
        owner = self._owners.get(uuid)
        latency_s = None if owner is None else owner.clock_set_latency_s(quantile)
        return None if latency_s is None else int(latency_s * 1e9)

    def submit_read_energy(self, uuid: str) -> Future[tuple[int, int]]:
        """Read the energy counter without waiting: the Future gives (CLOCK_MONOTONIC ns, mJ)."""
        return self._owner(uuid).read_energy()

    def reset_locked_sm_clock(self, uuid: str) -> None:
        self._wait(uuid, self._owner(uuid).reset_locked_sm_clock())

    def set_power_limit_w(self, uuid: str, limit_w: float) -> float:
        """Request a power limit (W); returns the enforced limit (W)."""
        return self._wait(uuid, self._owner(uuid).set_power_limit_w(limit_w))

    def submit_power_limit_w(self, uuid: str, limit_w: float) -> Future[float]:
        """Request a power limit (W) without waiting: the Future gives the enforced limit (W)."""
        return self._owner(uuid).set_power_limit_w(limit_w)

    def wait(self, uuid: str, future: Future[T]) -> T:
        """Wait for a submitted call at most `call_timeout_s`; `GpuError` when it fails or times out."""
        return self._wait(uuid, future)

    def save_state(self, uuid: str) -> GpuState:
        return self._wait(uuid, self._owner(uuid).save_state())

    def restore(self, uuid: str, state: GpuState) -> None:
        self._wait(uuid, self._owner(uuid).restore(state))

    def read_all(self) -> dict[str, GpuReading]:
        """Read every GPU in parallel; a GPU that fails or times out gets a reading with `error` set."""
        futures = self.submit_read_all()
        return {uuid: self._reading(uuid, future) for uuid, future in futures.items()}

    def submit_read_all(self) -> dict[str, Future[GpuReading]]:
        """Read every GPU without waiting (each reading then from `settled_reading`)."""
        return {uuid: owner.read() for uuid, owner in self._owners.items()}

    def settled_reading(self, uuid: str, future: Future[GpuReading]) -> GpuReading:
        """A submitted read's reading without waiting: one with `error` set when the read failed or is not
        done (the owner thread is stuck in a call)."""
        if not future.done():
            return _failed_reading(uuid, f"GPU {uuid} did not answer within {self._call_timeout_s:g} s")
        return self._reading(uuid, future)

    def healthy(self) -> bool:
        """True when every owner thread is alive and not stuck in a call."""
        return all(owner.healthy() for owner in self._owners.values())

    def stats(self) -> Mapping[str, dict[str, dict[str, float]]]:
        return {uuid: owner.stats() for uuid, owner in self._owners.items()}

    def stop(self) -> None:
        for owner in self._owners.values():
            owner.stop()

    def _owner(self, uuid: str) -> GpuOwner:
        owner = self._owners.get(uuid)
        if owner is None:
            raise UnknownGpuError(f"no GPU {uuid} on this node; `perseusctl status` lists the GPUs")
        return owner

    def _wait(self, uuid: str, future: Future[T]) -> T:
        try:
            return future.result(timeout=self._call_timeout_s)
        except FutureTimeoutError:
            raise GpuError(f"GPU {uuid} did not answer within {self._call_timeout_s:g} s") from None
        except GpuError:
            raise
        except Exception as exc:
            raise GpuError(f"GPU {uuid}: {type(exc).__name__}: {exc}") from exc

    def _reading(self, uuid: str, future: Future[GpuReading]) -> GpuReading:
        try:
            return self._wait(uuid, future)
        except GpuError as exc:
            return _failed_reading(uuid, str(exc))


def _failed_reading(uuid: str, error: str) -> GpuReading:
    return GpuReading(
        uuid=uuid,
        sm_clock_mhz=None,
        locked_sm_clock_mhz=None,
        power_w=None,
        power_limit_w=None,
        energy_mj=None,
        error=error,
    )

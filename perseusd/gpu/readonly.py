"""A GPU that is only read: the monitor-only daemon's view of every device (zeusd's `gpu-read`).

Every reading passes through; every write (a clock lock or unlock, a power limit) raises before it reaches the
device, so a monitor-only daemon cannot change a GPU whatever a request or a bug asks of it.
"""

from __future__ import annotations

from perseusd.gpu.backend import GpuDevice, GpuInfo
from perseusd.gpu.errors import GpuPermissionError
from perseusd.gpu.power_features import PowerFeature


class ReadOnlyError(GpuPermissionError):
    """A write to a GPU of a monitor-only daemon."""

    hint = "perseusd runs monitor-only (monitor_only = true): it never writes a clock or a limit"


class ReadOnlyDevice(GpuDevice):
    """`device` with every setter refused (counted in `refused_writes`)."""

    def __init__(self, device: GpuDevice) -> None:
        self._device = device
        self.refused_writes = 0

    @property
    def info(self) -> GpuInfo:
        return self._device.info

    def _refuse(self, op: str) -> ReadOnlyError:
        self.refused_writes += 1
        return ReadOnlyError("refused", uuid=self.info.uuid, op=op)

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        raise self._refuse(f"set_locked_sm_clock_mhz({clock_mhz})")

    def reset_locked_sm_clock(self) -> None:
        raise self._refuse("reset_locked_sm_clock")

    def set_power_limit_w(self, limit_w: float) -> float:
        raise self._refuse(f"set_power_limit_w({limit_w:g})")

    def locked_sm_clock_mhz(self) -> int | None:
        return self._device.locked_sm_clock_mhz()

    def sm_clock_mhz(self) -> int:
        return self._device.sm_clock_mhz()

    def clock_event_reasons(self) -> int:
        return self._device.clock_event_reasons()

    def power_features(self) -> tuple[PowerFeature, ...]:
        return self._device.power_features()

    def power_limit_w(self) -> float:
        return self._device.power_limit_w()

    def energy_mj(self) -> int:
        return self._device.energy_mj()

    def power_w(self) -> float:
        return self._device.power_w()

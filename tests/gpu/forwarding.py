"""A device wrapper for tests that watch what reaches a device: every call passes to the wrapped device,
announced first to `before` (which a test's subclass overrides to record or time it)."""

from __future__ import annotations

from perseusd.gpu.backend import GpuDevice, GpuInfo


class ForwardingDevice(GpuDevice):
    """`inner` itself, each call announced to `before(name)` before it passes on."""

    def __init__(self, inner: GpuDevice) -> None:
        self.inner = inner

    def before(self, name: str) -> None:
        """Called with the method's name before each call passes on (nothing here)."""

    @property
    def info(self) -> GpuInfo:
        return self.inner.info

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        self.before("set_locked_sm_clock_mhz")
        return self.inner.set_locked_sm_clock_mhz(clock_mhz)

    def reset_locked_sm_clock(self) -> None:
        self.before("reset_locked_sm_clock")
        self.inner.reset_locked_sm_clock()

    def locked_sm_clock_mhz(self) -> int | None:
        self.before("locked_sm_clock_mhz")
        return self.inner.locked_sm_clock_mhz()

    def sm_clock_mhz(self) -> int:
        self.before("sm_clock_mhz")
        return self.inner.sm_clock_mhz()

    def set_power_limit_w(self, limit_w: float) -> float:
        self.before("set_power_limit_w")
        return self.inner.set_power_limit_w(limit_w)

    def power_limit_w(self) -> float:
        self.before("power_limit_w")
        return self.inner.power_limit_w()

    def energy_mj(self) -> int:
        self.before("energy_mj")
        return self.inner.energy_mj()

    def power_w(self) -> float:
        self.before("power_w")
        return self.inner.power_w()

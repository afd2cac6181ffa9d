"""The GPU backend contract: what the daemon may ask of a GPU. Units are in the names.

Only `perseusd.gpu.nvml` imports `pynvml`; the simulated backend (`perseusd.gpu.sim`) is product code that
implements the same contract from real measured profiles. Calls on one `GpuDevice` are not thread-safe: the
daemon serialises them through one owner thread per GPU (`perseusd.gpu.owner`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from perseusd.gpu.power_features import PowerFeature

CLOCK_EVENT_SW_POWER_CAP = 0x4
"""NVML's clock-event (throttle) reason bit: the software power cap lowered the SM clock."""
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_SLOWDOWN = 0x8


CLOCK_SLOWDOWN_REASONS = (
    CLOCK_EVENT_SW_POWER_CAP | CLOCK_EVENT_HW_SLOWDOWN | CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_POWER_BRAKE
)
"""The clock-event reasons that slow the SM clock below what was asked (power, thermal, hardware)."""


def throttled(reasons: int) -> bool:
    """Whether clock-event reasons say the SM clock is held below what was asked, for any reason."""
    return bool(reasons & CLOCK_SLOWDOWN_REASONS)


def power_capped(reasons: int) -> bool:
    """Whether clock-event reasons say the clock is lowered to fit the power limit."""
    return bool(reasons & (CLOCK_EVENT_SW_POWER_CAP | CLOCK_EVENT_HW_POWER_BRAKE))


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one GPU, named by UUID on the wire (never by index)."""

    uuid: str
    index: int
    name: str
    pci_bus_id: str
    supported_sm_clocks_mhz: tuple[int, ...]
    """Supported SM clocks, highest first."""
    power_limit_min_w: float
    power_limit_max_w: float
    power_limit_default_w: float
    energy_counter_supported: bool
    device_minor: int | None = None
    """The minor number of the GPU's device node, `/dev/nvidia<minor>` (char major `NVIDIA_MAJOR`); None:
    unknown, then taken to be `index`. How a container's device list names the host GPU it holds."""


NVIDIA_MAJOR = 195
"""The char major of NVIDIA's GPU device nodes (`/dev/nvidia<N>`; 255 is /dev/nvidiactl, not a GPU)."""


def gpu_minor(info: GpuInfo) -> int:
    """The minor of the GPU's `/dev/nvidia<minor>` node (its index when the backend does not know it)."""
    return info.index if info.device_minor is None else info.device_minor


@dataclass(frozen=True)
class GpuState:
    """The controllable state of a GPU: what is saved before the first write and restored afterwards."""

    locked_sm_clock_mhz: int | None
    """None when clocks are not locked (the driver's default behaviour)."""
    power_limit_w: float


class GpuDevice(ABC):
    """One GPU. Setters need privileges on real hardware; every method may raise `GpuError` subclasses."""

    @property
    @abstractmethod
    def info(self) -> GpuInfo:
        """Static facts about this GPU."""

    @abstractmethod
    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        """Lock the SM clock to the supported clock nearest to `clock_mhz`; return the clock applied (MHz)."""

    @abstractmethod
    def reset_locked_sm_clock(self) -> None:
        """Unlock the SM clock (driver default behaviour)."""

    @abstractmethod
    def locked_sm_clock_mhz(self) -> int | None:
        """The locked SM clock (MHz), or None when not locked."""

    @abstractmethod
    def sm_clock_mhz(self) -> int:
        """The current SM clock (MHz)."""

    def clock_event_reasons(self) -> int:
        """NVML's clock-event (throttle) reasons bitmask now (`CLOCK_EVENT_*`); 0: none known."""
        return 0

    @abstractmethod
    def set_power_limit_w(self, limit_w: float) -> float:
        """Request a power limit (W); return the limit the GPU enforces (W)."""

    @abstractmethod
    def power_limit_w(self) -> float:
        """The enforced power limit (W)."""

    @abstractmethod
    def energy_mj(self) -> int:
        """The energy counter (mJ, monotonic since driver load). Updates every 20-100 ms on real GPUs."""

    @abstractmethod
    def power_w(self) -> float:
        """Instant power draw (W)."""

    def power_features(self) -> tuple[PowerFeature, ...]:
        """The driver's power features that can fight locked clocks (`perseusd.gpu.power_features`); none
        known by default (the simulated boards have none)."""
        return ()

    def state(self) -> GpuState:
        """The controllable state, as saved before a first write."""
        return GpuState(locked_sm_clock_mhz=self.locked_sm_clock_mhz(), power_limit_w=self.power_limit_w())


class GpuBackend(ABC):
    """A set of GPUs, enumerated once."""

    @abstractmethod
    def devices(self) -> list[GpuDevice]:
        """All GPUs of this node, in a stable order."""

    @abstractmethod
    def close(self) -> None:
        """Release the backend (NVML shutdown)."""

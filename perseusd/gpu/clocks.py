"""Clock arithmetic shared by the backends and the owner thread."""

from __future__ import annotations

from collections.abc import Sequence


def snap_clock_mhz(supported_mhz: Sequence[int], requested_mhz: int) -> int:
    """The supported clock nearest to `requested_mhz` (ties go to the higher clock). Units: MHz.

    Raises:
        ValueError: `supported_mhz` is empty.
    """
    if not supported_mhz:
        raise ValueError("no supported clocks to snap to")
    return min(supported_mhz, key=lambda clock: (abs(clock - requested_mhz), -clock))


def clamp(value: float, low: float, high: float) -> float:
    """`value` limited to [low, high]."""
    return max(low, min(high, value))

"""Simulated boards: what NVML shows of a GPU and how its silicon responds, read from data files.

A board (`perseusd/data/boards/<name>.json`) is data, not code: the GPU's name, its supported SM clocks, its
power-limit range and default, its idle power as a function of the locked clock, its energy counter's update
period and noise, how long a clock lock and a power-limit change take (the setter blocks like NVML's), and
whether computations are power-capped. A board carries no workload: the per-clock cost of computations comes
from the profile the workload process brings (`perseusd.workload.sim_costs`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from typing import Any

from perseusd.gpu.errors import GpuInvalidArgumentError

BOARD_NAMES: tuple[str, ...] = ("a100_sxm", "a40", "h100_sxm")
"""The boards shipped in `perseusd/data/boards/` (`perseusd --sim-model NAME`)."""


@dataclass(frozen=True)
class ClockLockTiming:
    """How long `set_locked_sm_clock_mhz` blocks its caller (s), and when within the call the clock acts."""

    call_min_s: float
    call_max_s: float
    act_min_s: float
    act_max_s: float

    def draw(self, rng: random.Random) -> tuple[float, float]:
        """(act_s, call_s) of one call: it lasts `call_s`; the new clock acts `act_s` after it starts."""
        call_s = rng.uniform(self.call_min_s, self.call_max_s)
        act_s = min(call_s, rng.uniform(self.act_min_s, self.act_max_s))
        return act_s, call_s


@dataclass(frozen=True)
class Board:
    """One simulated board. Clocks in MHz, powers in W, times in s."""

    name: str
    gpu_name: str
    source: str
    clocks_mhz: tuple[int, ...]
    """Supported SM clocks, highest first."""
    power_limit_min_w: float
    power_limit_max_w: float
    power_limit_default_w: float
    power_capping: bool
    """Whether a computation drawing more than the power limit runs at a lower clock."""
    idle_points: tuple[tuple[int, float], ...]
    """(clock, idle power) measured locked, ascending clocks; empty: `idle_unlocked_w` always."""
    idle_unlocked_w: float
    counter_period_s: float
    counter_noise: float
    clock_lock: ClockLockTiming
    power_limit_lower_s: float
    """How long lowering the power limit takes to act (the setter blocks that long)."""
    power_limit_raise_s: float

    @property
    def max_clock_mhz(self) -> int:
        return self.clocks_mhz[0]

    @property
    def min_clock_mhz(self) -> int:
        return self.clocks_mhz[-1]

    @property
    def blocking_power_w(self) -> float:
        """Idle power with clocks unlocked (W): what a GPU draws waiting when nobody manages it."""
        return self.idle_unlocked_w

    def idle_power_w(self, locked_mhz: int | None) -> float:
        """Idle power at a locked clock (None: unlocked): linear between measured clocks and beyond."""
        points = self.idle_points
        if locked_mhz is None or not points:
            return self.idle_unlocked_w
        if len(points) == 1:
            return points[0][1]
        index = 1
        while index < len(points) - 1 and locked_mhz > points[index][0]:
            index += 1
        (low_mhz, low_w), (high_mhz, high_w) = points[index - 1], points[index]
        slope = (high_w - low_w) / (high_mhz - low_mhz)
        return max(0.0, low_w + slope * (locked_mhz - low_mhz))

    def clock_range_text(self) -> str:
        return f"{self.min_clock_mhz}-{self.max_clock_mhz} MHz"


def load_board(name: str) -> Board:
    """The shipped board `name` (one of `BOARD_NAMES`)."""
    if name not in BOARD_NAMES:
        known = ", ".join(BOARD_NAMES)
        raise GpuInvalidArgumentError(f"unknown simulated board {name!r} (known: {known})", op="load_board")
    resource = resources.files("perseusd").joinpath("data", "boards", f"{name}.json")
    try:
        return board_from_dict(json.loads(resource.read_text(encoding="utf-8")))
    except (KeyError, TypeError, ValueError) as error:
        message = f"board file {name}.json is malformed ({error!r})"
        raise GpuInvalidArgumentError(message, op="load_board") from error


def board_from_dict(data: dict[str, Any]) -> Board:
    """A board from its JSON form (see the files in `perseusd/data/boards/`)."""
    clocks, limits, idle = data["sm_clocks_mhz"], data["power_limit_w"], data["idle_power_w"]
    counter, lock, limit_s = data["energy_counter"], data["clock_lock_s"], data["power_limit_s"]
    step = int(clocks["step"])
    if step <= 0 or int(clocks["min"]) > int(clocks["max"]):
        raise ValueError("sm_clocks_mhz needs min <= max and step > 0")
    board = Board(
        name=str(data["name"]),
        gpu_name=str(data["gpu_name"]),
        source=str(data["source"]),
        clocks_mhz=tuple(range(int(clocks["max"]), int(clocks["min"]) - 1, -step)),
        power_limit_min_w=float(limits["min"]),
        power_limit_max_w=float(limits["max"]),
        power_limit_default_w=float(limits["default"]),
        power_capping=bool(data["power_capping"]),
        idle_points=tuple(sorted((int(c), float(w)) for c, w in idle["by_clock_mhz"])),
        idle_unlocked_w=float(idle["unlocked"]),
        counter_period_s=float(counter["period_s"]),
        counter_noise=float(counter["noise"]),
        clock_lock=ClockLockTiming(
            float(lock["call_min"]), float(lock["call_max"]), float(lock["act_min"]), float(lock["act_max"])
        ),
        power_limit_lower_s=float(limit_s["lower"]),
        power_limit_raise_s=float(limit_s["raise"]),
    )
    if board.clocks_mhz[-1] != int(clocks["min"]):
        raise ValueError("sm_clocks_mhz: max - min must be a multiple of step")
    return board

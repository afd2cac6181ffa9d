"""What a computation costs on a simulated board: the workload's profile, completed over the board's clocks.

A workload process brings its own per-clock costs (a `Profile`, the shared CSV format). Every clock of the
profile must be one the board supports (`check_profile_fits`). A profile measured at only some of the board's
clocks is normal; for each (stage, instruction):

- between two measured clocks, time and energy are interpolated linearly;
- above the highest measured clock, the cost is that clock's;
- below the lowest measured clock, time and power follow a fit on the measured clocks
  (`perseusd.planner.below_clock`: time ~ a + b/f, power ~ blocking power + c f^k), so a power limit below
  the lowest measured clock's power finds a lower clock that fits, as a real GPU does.

Power capping (boards with `power_capping`): a computation whose power at the locked clock (energy / time)
exceeds the power limit runs at the highest clock whose power fits (the board's lowest if none does), with
that clock's time and energy, and reports that clock. The node cap's model of a job under limits
(`perseusd.power.limit_model`) and the offline replay use the same costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseusd.gpu.errors import GpuInvalidArgumentError
from perseusd.gpu.sim_boards import Board
from perseusd.planner.below_clock import extrapolate_below
from perseusd.planner.profile import Profile


@dataclass(frozen=True)
class ComputationCost:
    """Time (s) and energy (J) of one computation at one clock."""

    time_s: float
    energy_j: float

    @property
    def power_w(self) -> float:
        """Average busy power (W)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class RunCost:
    """What one computation costs when started at a locked clock under a power limit."""

    cost: ComputationCost
    clock_mhz: int
    """The clock it runs at: the locked one, or lower when power-capped."""
    capped: bool


def check_profile_fits(profile: Profile, board: Board) -> None:
    """Raise `GpuInvalidArgumentError` naming the profile's clocks that the board does not support."""
    supported = set(board.clocks_mhz)
    missing = sorted({m.freq_mhz for m in profile.measurements} - supported)
    if missing:
        shown = ", ".join(str(c) for c in missing[:8]) + (", ..." if len(missing) > 8 else "")
        steps = board.clocks_mhz[0] - board.clocks_mhz[1] if len(board.clocks_mhz) > 1 else 0
        raise GpuInvalidArgumentError(
            f"profile {profile.source} has {len(missing)} clock(s) the {board.name} board does not support: "
            f"{shown} MHz (the board supports {board.clock_range_text()} in {steps} MHz steps)",
            op="load_profile",
        )


class WorkloadCosts:
    """A profile's costs at every clock of a board. Raises `GpuInvalidArgumentError` if they do not fit."""

    def __init__(self, profile: Profile, board: Board) -> None:
        check_profile_fits(profile, board)
        self.profile = profile
        self.board = board
        measured: dict[tuple[int, str], dict[int, ComputationCost]] = {}
        for m in profile.measurements:
            key = (m.stage, m.instruction.value)
            measured.setdefault(key, {})[m.freq_mhz] = ComputationCost(m.time_s, m.energy_j)
        self._costs = {
            key: _complete(by_clock, board.clocks_mhz, board.blocking_power_w)
            for key, by_clock in measured.items()
        }
        self._capped: dict[tuple[int, str, int, float], RunCost] = {}

    @property
    def clocks_mhz(self) -> tuple[int, ...]:
        """The board's clocks, highest first: every one has a cost."""
        return self.board.clocks_mhz

    @property
    def keys(self) -> list[tuple[int, str]]:
        return sorted(self._costs)

    def cost(self, stage: int, instruction: str, clock_mhz: int) -> ComputationCost:
        """The cost at a board clock, without power capping."""
        by_clock = self._costs.get((stage, instruction))
        if by_clock is None:
            raise GpuInvalidArgumentError(
                f"profile {self.profile.source} has no stage {stage} {instruction!r}", op="run"
            )
        found = by_clock.get(clock_mhz)
        if found is None:
            raise GpuInvalidArgumentError(f"board {self.board.name} has no clock {clock_mhz} MHz", op="run")
        return found

    def run_cost(self, stage: int, instruction: str, clock_mhz: int, power_limit_w: float) -> RunCost:
        """The cost of a computation started at `clock_mhz` under `power_limit_w`, capped by the board."""
        key = (stage, instruction, clock_mhz, power_limit_w)
        found = self._capped.get(key)
        if found is None:
            found = self._capped[key] = self._run_cost(stage, instruction, clock_mhz, power_limit_w)
        return found

    def _run_cost(self, stage: int, instruction: str, clock_mhz: int, power_limit_w: float) -> RunCost:
        cost = self.cost(stage, instruction, clock_mhz)
        if not self.board.power_capping or cost.power_w <= power_limit_w:
            return RunCost(cost, clock_mhz, capped=False)
        for clock in self.board.clocks_mhz:
            if clock < clock_mhz:
                lower = self.cost(stage, instruction, clock)
                if lower.power_w <= power_limit_w:
                    return RunCost(lower, clock, capped=True)
        lowest = self.board.min_clock_mhz
        return RunCost(self.cost(stage, instruction, lowest), lowest, capped=True)


def _complete(
    measured: dict[int, ComputationCost], clocks_mhz: tuple[int, ...], static_w: float
) -> dict[int, ComputationCost]:
    """Costs at every clock of `clocks_mhz` from those measured at some of them (see the module docstring)."""
    known = sorted(measured)
    high_mhz = known[-1]
    below = extrapolate_below({c: (m.time_s, m.energy_j) for c, m in measured.items()}, clocks_mhz, static_w)
    completed: dict[int, ComputationCost] = {}
    for clock in clocks_mhz:
        if clock in measured:
            completed[clock] = measured[clock]
        elif clock > high_mhz:
            completed[clock] = measured[high_mhz]
        elif clock in below:
            completed[clock] = ComputationCost(*below[clock])
        else:
            lower = max(c for c in known if c < clock)
            upper = min(c for c in known if c > clock)
            weight = (clock - lower) / (upper - lower)
            a, b = measured[lower], measured[upper]
            completed[clock] = ComputationCost(
                a.time_s + weight * (b.time_s - a.time_s), a.energy_j + weight * (b.energy_j - a.energy_j)
            )
    return completed

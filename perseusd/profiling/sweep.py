"""One stage's online profiling sweep: which clock to run the next training iteration at, and when to stop.

The sweep starts at the highest clock and goes down, one clock per iteration, staying at a clock for more
iterations until every key has enough computations and a precise enough energy (or a cap is reached).

What it skips, and why that loses no Pareto-optimal option:

- Lower clocks are never faster. Energy per computation first falls as the clock goes down (less power for
  nearly the same time), reaches a minimum and then rises (the time grows faster than the power falls). Once
  a key's energy has risen `rise_limit` times in a row, every lower clock is slower and (by that convexity)
  costlier than one already measured, so it cannot be Pareto-optimal: the key needs no more clocks, and the
  sweep ends when every key of the stage is there (the clock is shared by all of a GPU's computations).
  Requiring several rises in a row keeps measurement noise near the minimum from ending the sweep early.
- `clock_stride` profiles only every k-th clock and `min_clock_mhz` none below a floor, to bound the time
  spent profiling.
- `kept` drops, per key, every measured clock that is both slower and costlier than (or as slow and as
  costly as) another measured clock of that key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.profiling.estimator import OptionEstimate, StageEstimate
from perseusd.profiling.trace import OptionKey


@dataclass(frozen=True)
class SweepSettings:
    """How a stage's sweep decides when a clock is done and when to stop."""

    rise_limit: int = 5
    """Stop a key after its energy rose this many times in a row (clock by clock, going down)."""
    min_computations: int = 8
    """Computations per (key, clock) before a clock is done ..."""
    target_energy_rel_err: float = 0.01
    """... and the energy's relative standard error below this."""
    max_iterations_per_clock: int = 6
    """Give up waiting for precision after this many iterations at one clock (see `min_windows_per_clock`)."""
    clock_stride: int = 1
    """Profile every k-th supported clock (the highest always)."""
    min_clock_mhz: int = 0
    """Never profile below this clock."""
    min_windows_per_clock: int = 100
    """Give up on precision only once every key's computations at the clock also overlapped this many
    counter windows (a short iteration gives few windows, so it gets more iterations) ..."""
    hard_max_iterations_per_clock: int = 30
    """... and after this many iterations at one clock in any case."""

    def __post_init__(self) -> None:
        counts = (self.rise_limit, self.min_computations, self.max_iterations_per_clock, self.clock_stride)
        if min(counts) < 1 or self.hard_max_iterations_per_clock < self.max_iterations_per_clock:
            raise ValueError(
                "rise_limit, min_computations, max_iterations_per_clock and clock_stride must be >= 1, "
                "hard_max_iterations_per_clock >= max_iterations_per_clock"
            )
        if not self.target_energy_rel_err > 0:
            raise ValueError(f"target_energy_rel_err must be > 0 (got {self.target_energy_rel_err})")


class StageSweep:
    """One stage's sweep over clocks, highest first, one clock per iteration (or several iterations).

    Not thread-safe: one owner calls `iteration_done` after each profiling iteration.
    """

    def __init__(
        self, supported_clocks_mhz: Sequence[int], keys: Sequence[OptionKey], settings: SweepSettings
    ) -> None:
        candidates = sorted({c for c in supported_clocks_mhz if c >= settings.min_clock_mhz}, reverse=True)
        self._clocks_mhz = candidates[:: settings.clock_stride]
        self._keys = tuple(dict.fromkeys(keys))
        self._settings = settings
        self._index = 0
        self._iterations = 0
        self._rises = dict.fromkeys(self._keys, 0)
        self._done = not self._clocks_mhz or not self._keys

    @property
    def current_clock_mhz(self) -> int | None:
        """The clock for the next iteration (MHz); None when the sweep is done."""
        return None if self._done else self._clocks_mhz[self._index]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def clocks_done(self) -> int:
        """Clocks finished so far."""
        return self._index

    @property
    def clocks_total(self) -> int:
        """Clocks the sweep would profile without stopping early."""
        return len(self._clocks_mhz)

    def iteration_done(self, estimate: StageEstimate) -> None:
        """Account one profiling iteration at the current clock.

        `estimate` covers ALL of this stage's intervals so far (earlier clocks' estimates sharpen too). The
        sweep moves to the next clock once the current one is precise enough or has had its iterations.
        """
        if self._done:
            return
        self._iterations += 1
        clock_mhz = self._clocks_mhz[self._index]
        if not self._precise(estimate, clock_mhz) and not self._give_up(estimate, clock_mhz):
            return
        if self._index > 0:
            self._count_rises(estimate, self._clocks_mhz[self._index - 1], clock_mhz)
        self._index += 1
        self._iterations = 0
        stopped = all(rises >= self._settings.rise_limit for rises in self._rises.values())
        self._done = stopped or self._index == len(self._clocks_mhz)

    def _precise(self, estimate: StageEstimate, clock_mhz: int) -> bool:
        for key in self._keys:
            option = estimate.options.get((key, clock_mhz))
            if option is None or option.count < self._settings.min_computations:
                return False
            if not option.energy_rel_err < self._settings.target_energy_rel_err:
                return False
        return True

    def _give_up(self, estimate: StageEstimate, clock_mhz: int) -> bool:
        settings = self._settings
        if self._iterations >= settings.hard_max_iterations_per_clock:
            return True
        if self._iterations < settings.max_iterations_per_clock:
            return False
        options = [estimate.options.get((key, clock_mhz)) for key in self._keys]
        return all(o is not None and o.windows >= settings.min_windows_per_clock for o in options)

    def _count_rises(self, estimate: StageEstimate, higher_mhz: int, lower_mhz: int) -> None:
        """Per key not yet stopped: one more rise in a row, or back to zero; unchanged without both values."""
        for key in self._keys:
            if self._rises[key] >= self._settings.rise_limit:
                continue
            higher = estimate.options.get((key, higher_mhz))
            lower = estimate.options.get((key, lower_mhz))
            if higher is None or lower is None:
                continue
            self._rises[key] = self._rises[key] + 1 if lower.energy_j > higher.energy_j else 0

    def kept(self, estimate: StageEstimate) -> list[OptionEstimate]:
        """This stage's measured options that can be Pareto-optimal, per key in (time, energy).

        Only the sweep's keys and clocks count. Sorted by key, then fastest first.
        """
        clocks = set(self._clocks_mhz)
        kept: list[OptionEstimate] = []
        for key in sorted(self._keys):
            measured = [o for (k, c), o in estimate.options.items() if k == key and c in clocks]
            kept.extend(pareto_options(measured))
        return kept


def pareto_options(options: Sequence[OptionEstimate]) -> list[OptionEstimate]:
    """The options no other option beats in both time and energy, fastest first.

    An option is dropped when another is at most as slow and at most as costly; of exact ties, the higher
    clock stays.
    """
    ordered = sorted(options, key=lambda o: (o.time_s, o.energy_j, -o.clock_mhz))
    front: list[OptionEstimate] = []
    for option in ordered:
        if not front or option.energy_j < front[-1].energy_j:
            front.append(option)
    return front

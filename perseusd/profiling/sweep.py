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
- `clock_stride` profiles only every k-th clock, `max_clocks` at most that many clocks spread evenly over
  the range, `iteration_budget` as many as fit a budget of iterations at the pace the highest clock took,
  and `min_clock_mhz` none below a floor, to bound the time spent profiling. The curves are smooth, so a
  subset loses little; the planner uses the clocks measured (nothing is interpolated: a real GPU's curve
  wiggles by a few percent between neighbouring clocks, more than the profile's error bound).
- Power capping: a lock above the clock the power limit allows changes nothing but the label (the GPU runs
  the capped clock whatever the lock says). When the daemon saw the GPU power-capped at the highest clock,
  it passes the clock that really ran (`iteration_done(..., capped_clock_mhz=...)`) and the sweep goes on
  from the highest clock at or below it: the clocks in between would measure the same computation again.
- `kept` drops, per key, every measured clock that is both slower and costlier than (or as slow and as
  costly as) another measured clock of that key, the cost being the energy less what the wait a slower
  computation fills would have drawn at the least waiting power (`pareto_options`): below the clock of
  least energy a lower clock can still save over the iteration. The daemon keeps each key's highest clock
  (all-max) without letting it remove another (`top_aside`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perseusd.profiling.estimator import OptionEstimate, StageEstimate
from perseusd.profiling.trace import OptionKey


@dataclass(frozen=True)
class SweepSettings:
    """How a stage's sweep decides when a clock is done and when to stop."""

    rise_limit: int = 5
    """Stop a key after its energy rose this many times in a row (clock by clock, going down) ..."""
    rise_span_mhz: int = 0
    """... and over at least this many MHz (more rises when the clocks are close; 0: `rise_limit` only)."""
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
    min_precise_windows: int = 0
    """A clock is precise only once its segment's fit used this many counter windows (a fit of few windows
    underestimates its own error: every standard error comes from the residuals of all of them) and every
    key's computations overlapped `MIN_KEY_WINDOWS` of them (or this many, if fewer)."""
    max_clocks: int = 0
    """Profile at most this many clocks (the highest always), evenly spaced; 0: no limit."""
    iteration_budget: int = 0
    """Space the clocks below the highest so that, at the pace the highest clock took (iterations per
    clock), they fit about this many iterations (at least 3 clocks); 0: no budget."""

    deep_iteration_limit: int = 0
    """With a budget: a clock below the first one under the budget's range is begun only if the stage's
    iterations so far plus `hard_max_iterations_per_clock` stay within this many (0: no limit). The range's
    clocks are the curve every plan needs; those deeper only fill waits, and a stage whose least energy lies
    deep would otherwise profile for as long as it has clocks above its rise."""

    def __post_init__(self) -> None:
        counts = (self.rise_limit, self.min_computations, self.max_iterations_per_clock, self.clock_stride)
        if min(counts) < 1 or self.hard_max_iterations_per_clock < self.max_iterations_per_clock:
            raise ValueError(
                "rise_limit, min_computations, max_iterations_per_clock and clock_stride must be >= 1, "
                "hard_max_iterations_per_clock >= max_iterations_per_clock"
            )
        limits = (self.max_clocks, self.iteration_budget, self.min_precise_windows, self.deep_iteration_limit)
        if min(limits) < 0:
            raise ValueError(
                "max_clocks, iteration_budget, min_precise_windows and deep_iteration_limit must be >= 0"
            )
        if not self.target_energy_rel_err > 0:
            raise ValueError(f"target_energy_rel_err must be > 0 (got {self.target_energy_rel_err})")


ONLINE_SWEEP: dict[str, Any] = {
    "target_energy_rel_err": 0.0075,
    "rise_limit": 1,
    "rise_span_mhz": 75,
    "max_iterations_per_clock": 8,
    "hard_max_iterations_per_clock": 12,
    "min_windows_per_clock": 40,
    "min_precise_windows": 24,
}
"""The daemon's per-clock settings (docs/profiling.md, "The sweep"): a clock is precise once its fit used 24
windows and every key's energy has a standard error below 0.75 % (over 40 seeded H100 profiles the worst of
~1,600 options lies up to ~4 standard errors off: 1 % let it reach 3.9 %), or given up after 8 iterations and
40 windows (12 iterations at most); rises over 75 MHz stop the sweep (one rise where the budget spaces clocks
~200 MHz apart, as on an H100: a rise that far is real, and one faked by noise near the flat minimum costs
only clocks below the least energy; five where every 15 MHz clock is profiled, as on an A100)."""

RISE_MIN_SLOWER = 0.005
"""A lower clock counts as a rise only when it is also this much slower than the higher one."""
RISE_NOISE_SIGMAS = 2.0
"""Where one rise stops the sweep, it counts only when the energy rose by more than this many standard errors
of the difference: near the flat least energy of a recomputing stage (energy within 0.5 % from 1215 down to
720 MHz on an H100) the first clock under the budget's range rose or fell by noise, and one job's runs stopped
a stage at 960 MHz or went on to 660 (dense-uneven-rc4x16: 17.3 and 19.0 % planned on the board's costs)."""

BUDGET_RANGE = 0.5
"""A budget is spread over the clocks down to this fraction of the highest: GPUs' least energy lies above
it (H100 ~1000 of 1980 MHz); below it the sweep goes on at half the spacing (where that keeps clocks
`rise_span_mhz` apart) until the rise stop."""
MIN_BUDGET_CLOCKS = 3
"""Clocks a budget always allows (a plan needs a curve: the highest, the lowest and one between)."""
PACE_CLOCKS = 3
"""With a budget and a `deep_iteration_limit`, the pace of the clocks below the highest is checked once this
many of them are done, and after each one more (`StageSweep._hold_budget`)."""

MIN_KEY_WINDOWS = 8
"""A key's computations must overlap at least this many of the fit's windows for its clock to be precise."""


class StageSweep:
    """One stage's sweep over clocks, highest first, one clock per iteration (or several iterations).

    Not thread-safe: one owner calls `iteration_done` after each profiling iteration.
    """

    def __init__(
        self, supported_clocks_mhz: Sequence[int], keys: Sequence[OptionKey], settings: SweepSettings
    ) -> None:
        candidates = sorted({c for c in supported_clocks_mhz if c >= settings.min_clock_mhz}, reverse=True)
        self._candidates_mhz = candidates
        self._stride = settings.clock_stride
        if settings.max_clocks > 0:
            self._stride = max(self._stride, -(-len(candidates) // settings.max_clocks))
        self._clocks_mhz = candidates[:: self._stride]
        self._capped_mhz: int | None = None
        self._keys = tuple(dict.fromkeys(keys))
        self._settings = settings
        self._index = 0
        self._iterations = 0
        self._total_iterations = 0
        self._top_iterations = 0  # iterations the highest clock took (the pace that spaced the others)
        self._deep_below_mhz: int | None = None  # clocks below this one are deep (`deep_iteration_limit`)
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

    @property
    def clocks_mhz(self) -> tuple[int, ...]:
        """The clocks the sweep profiles (or profiled), highest first."""
        return tuple(self._clocks_mhz)

    def iteration_done(self, estimate: StageEstimate, capped_clock_mhz: int | None = None) -> None:
        """Account one profiling iteration at the current clock.

        `estimate` covers ALL of this stage's intervals so far (earlier clocks' estimates sharpen too). The
        sweep moves to the next clock once the current one is precise enough or has had its iterations.
        `capped_clock_mhz`: at the highest clock, the clock the GPU really ran while it reported power
        capping (None: not capped, or not known); the clocks above it are skipped.
        """
        if self._done:
            return
        self._iterations += 1
        self._total_iterations += 1
        clock_mhz = self._clocks_mhz[self._index]
        if self._index == 0 and capped_clock_mhz is not None:
            self._capped_mhz = capped_clock_mhz
        if not self._precise(estimate, clock_mhz) and not self._give_up(estimate, clock_mhz):
            return
        if self._index == 0:
            self._plan_rest(self._iterations)
        elif self._counts_rises(clock_mhz):
            self._count_rises(estimate, self._clocks_mhz[self._index - 1], clock_mhz)
        self._index += 1
        self._iterations = 0
        self._hold_budget()
        stopped = all(rises >= self._rises_needed() for rises in self._rises.values())
        self._done = stopped or self._index == len(self._clocks_mhz) or not self._next_fits()

    def _next_fits(self) -> bool:
        """Whether the next clock may begin: a deep one only within `deep_iteration_limit`."""
        limit = self._settings.deep_iteration_limit
        deep = self._deep_below_mhz is not None and self._clocks_mhz[self._index] < self._deep_below_mhz
        return (
            not deep
            or limit <= 0
            or (self._total_iterations + self._settings.hard_max_iterations_per_clock <= limit)
        )

    def _counts_rises(self, clock_mhz: int) -> bool:
        """Whether a rise at `clock_mhz` counts: always without a budget; with one, only below the range it
        spreads its clocks over. Those clocks are the curve the plan needs, read from a handful of clocks
        ~250 MHz apart near the flat, power-capped top, where timing noise fakes a rise (it once left a stage
        of an H100 job with its highest clock only)."""
        return self._settings.iteration_budget <= 0 or clock_mhz < self._clocks_mhz[0] * BUDGET_RANGE

    def _hold_budget(self) -> None:
        """With a budget and a `deep_iteration_limit`: once `PACE_CLOCKS` clocks below the highest are done,
        if the budget's range left would take the stage past the limit at the pace they took, space the
        clocks left as `_plan_rest` would have at that pace: a stride that many times wider, so that the
        range fits about `iteration_budget`, from one stride below the last clock done. The highest clock's
        pace, which spaced them, can be luck: one 8-stage job's stage was precise there in one iteration,
        spaced its clocks 30 MHz apart, took three iterations at each and profiled 98 iterations where its
        other stages took 20-34."""
        settings = self._settings
        below_done = self._index - 1
        if settings.iteration_budget <= 0 or settings.deep_iteration_limit <= 0 or below_done < PACE_CLOCKS:
            return
        floor_mhz = self._clocks_mhz[0] * BUDGET_RANGE
        end = self._index
        while end < len(self._clocks_mhz) and self._clocks_mhz[end] >= floor_mhz:
            end += 1
        left = self._clocks_mhz[self._index : end]
        pace = (self._total_iterations - self._top_iterations) / below_done
        if not left or self._total_iterations + len(left) * pace <= settings.deep_iteration_limit:
            return
        affordable = max(settings.iteration_budget - self._total_iterations, pace) / pace  # clocks, >= 1
        self._stride *= max(2, math.ceil(len(left) / affordable))
        last_mhz = self._clocks_mhz[self._index - 1]
        rest = [c for c in self._candidates_mhz if c < last_mhz][self._stride - 1 :]
        below_range, self._deep_below_mhz = self._closer_below(rest, floor_mhz)
        self._clocks_mhz = [*self._clocks_mhz[: self._index], *below_range]

    def _plan_rest(self, first_iterations: int) -> None:
        """Once the highest clock is done: the clocks below it, spaced so that they fit `iteration_budget` at
        the highest clock's pace (and `max_clocks`), from one stride below the highest or, when the GPU was
        power-capped there, from the capped clock if that is lower."""
        self._top_iterations = first_iterations
        top = self._clocks_mhz[0]
        below = [c for c in self._candidates_mhz if c < top]
        budget = self._settings.iteration_budget
        if budget > 0 and below:
            pace = min(max(first_iterations, 1), self._settings.max_iterations_per_clock)
            # The pace is noise (where the precision rule happens to stop): rounded up to a power of two,
            # runs of one job space their clocks alike (see docs/profiling.md, "Which clocks").
            pace = min(1 << (pace - 1).bit_length(), self._settings.max_iterations_per_clock)
            affordable = max(MIN_BUDGET_CLOCKS, budget // pace) - 1
            useful = [c for c in below if c >= top * BUDGET_RANGE]
            self._stride = max(self._stride, -(-len(useful) // affordable))
        start_mhz = below[self._stride - 1] if len(below) >= self._stride else top
        if self._capped_mhz is not None:
            start_mhz = min(start_mhz, self._capped_mhz)
        rest = [c for c in below if c <= start_mhz]
        if budget > 0:
            below_range, self._deep_below_mhz = self._closer_below(rest, top * BUDGET_RANGE)
            self._clocks_mhz = [top, *below_range]
        else:
            self._clocks_mhz = [top, *rest[:: self._stride]]

    def _closer_below(self, clocks_mhz: list[int], floor_mhz: float) -> tuple[list[int], int | None]:
        """`clocks_mhz` (descending) at the stride down to the first below `floor_mhz`, then at half the
        stride if that keeps them `rise_span_mhz` apart: the least energy lies near there, and the plans that
        fill waits want clocks in the gap around it (docs/profiling.md, "Below half the highest"). Also
        that first clock below `floor_mhz` (None: none), under which clocks are deep."""
        spaced = clocks_mhz[:: self._stride]
        first_below = sum(1 for c in spaced if c >= floor_mhz)
        if first_below >= len(spaced):
            return spaced, None
        pivot_mhz = spaced[first_below]
        half = self._stride // 2
        closer = clocks_mhz[clocks_mhz.index(pivot_mhz) :: max(half, 1)]
        if half == 0 or len(closer) < 2 or closer[0] - closer[1] < self._settings.rise_span_mhz:
            return spaced, pivot_mhz
        return spaced[:first_below] + closer, pivot_mhz

    def _precise(self, estimate: StageEstimate, clock_mhz: int) -> bool:
        if estimate.windows < self._settings.min_precise_windows:
            return False  # every standard error rests on the fit's residuals: too few windows, too few
        for key in self._keys:
            option = estimate.options.get((key, clock_mhz))
            if option is None or option.count < self._settings.min_computations:
                return False
            if option.windows < min(self._settings.min_precise_windows, MIN_KEY_WINDOWS):
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

    def _rises_needed(self) -> int:
        """`rise_limit`, or more when the profiled clocks are close together: the rises in a row must span at
        least `rise_span_mhz` (noise fakes a rise between clocks 15 MHz apart, rarely over 75)."""
        span_mhz = self._settings.rise_span_mhz
        if len(self._clocks_mhz) < 2 or span_mhz <= 0:
            return self._settings.rise_limit
        spacing_mhz = max(1, self._clocks_mhz[-2] - self._clocks_mhz[-1])
        return max(self._settings.rise_limit, -(-span_mhz // spacing_mhz))

    def _count_rises(self, estimate: StageEstimate, higher_mhz: int, lower_mhz: int) -> None:
        """Per key not yet stopped: one more rise in a row, or back to zero; unchanged without both values."""
        needed = self._rises_needed()
        margin_sigmas = RISE_NOISE_SIGMAS if needed == 1 else 0.0
        for key in self._keys:
            if self._rises[key] >= needed:
                continue
            higher = estimate.options.get((key, higher_mhz))
            lower = estimate.options.get((key, lower_mhz))
            if higher is None or lower is None:
                continue
            # A rise needs a slower lower clock too: under a power cap the top clocks run alike (flat time),
            # and noise there says nothing about the curve below.
            slower = lower.time_s > higher.time_s * (1.0 + RISE_MIN_SLOWER)
            margin_j = margin_sigmas * _difference_err_j(lower, higher) if margin_sigmas else 0.0
            rose = lower.energy_j > higher.energy_j + margin_j
            self._rises[key] = self._rises[key] + 1 if slower and rose else 0

    def kept(
        self, estimate: StageEstimate, waiting_w: float = 0.0, top_aside: bool = False
    ) -> list[OptionEstimate]:
        """This stage's measured options that can be Pareto-optimal, per key in (time, energy less what a
        wait of that time draws at `waiting_w`; `pareto_options`, with `top_aside`).

        Only the sweep's keys and clocks count. Sorted by key, then fastest first.
        """
        clocks = set(self._clocks_mhz)
        kept: list[OptionEstimate] = []
        for key in sorted(self._keys):
            measured = [o for (k, c), o in estimate.options.items() if k == key and c in clocks]
            kept.extend(pareto_options(measured, waiting_w, top_aside))
        return kept


def _difference_err_j(a: OptionEstimate, b: OptionEstimate) -> float:
    """The standard error of the difference of two options' energies (inf when either is unknown)."""
    return math.hypot(a.energy_j * a.energy_rel_err, b.energy_j * b.energy_rel_err)


def pareto_options(
    options: Sequence[OptionEstimate], waiting_w: float = 0.0, top_aside: bool = False
) -> list[OptionEstimate]:
    """The options no other option beats in both time and cost, fastest first: the cost is the energy less
    `waiting_w` x the time (0: the energy). With `top_aside`, the highest clock stays and beats none.

    A computation off the critical path that runs slower shortens the wait after it, and a waiting GPU draws
    power: a lower clock whose energy exceeds a higher one's by less than `waiting_w` x the time it adds
    still saves energy over the iteration (below the clock of least energy, where lower clocks cost more per
    computation). An option is dropped when another is at most as slow and at most as costly; of exact ties,
    the higher clock stays.

    The highest clock is what all-max locks, kept for it anyway. On a power-capped GPU it is a label (the
    clocks just below run as fast), so a small error in its estimate decides whether they survive: the
    energy of computations that run back to back is split between them 2.7-5.0 % off (h200-layers4x16's
    last stage at 1980 MHz), and as a dominator the top clock removed the clocks below it the plan needs.
    """
    if top_aside and options:
        top = max(options, key=lambda o: o.clock_mhz)
        rest = pareto_options([o for o in options if o is not top], waiting_w)
        return sorted([top, *rest], key=_fastest)
    front: list[OptionEstimate] = []
    for option in sorted(options, key=_fastest):
        if not front or _cost(option, waiting_w) < _cost(front[-1], waiting_w):
            front.append(option)
    return front


def _fastest(option: OptionEstimate) -> tuple[float, float, int]:
    return option.time_s, option.energy_j, -option.clock_mhz


def _cost(option: OptionEstimate, waiting_w: float) -> float:
    return option.energy_j - waiting_w * option.time_s

"""What a GPU draws while it waits (pipeline bubbles), by the clock it holds.

An idle GPU's power follows its locked clock: an H100 SXM measured 130 W idle locked at 1980 MHz, 100 W at
1440 and 79 W at 900 (docs/energy.md, "Waiting power"). A plan that lowers clocks therefore also lowers the
power of the waits between its computations, and a model that holds every wait at one blocking power (the
planner's objective, `evaluate`) predicts less saving than the GPU delivers, most on bubble-heavy pipelines.

Which clock a GPU holds while it waits follows from how the daemon switches (`switching`): it raises the
clock ahead of a run and lowers it when the previous computation ends, so the wait before a computation is
held at that computation's clock, except a lowering's first `latency_s`, held at the previous (higher) one.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import SWITCHCORE, dag_arrays, stage_ptr_of


@dataclass(frozen=True)
class WaitingPower:
    """A GPU's waiting power (W) by held clock: `points` (clock MHz, W) measured, linear between them and
    the nearest one's beyond them; none: `blocking_w` at every clock (the clock-independent model)."""

    blocking_w: float
    points: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        clocks = [clock for clock, _ in self.points]
        if clocks != sorted(set(clocks)):
            raise ValueError(f"waiting power points need distinct ascending clocks (got {clocks})")
        if any(not watts >= 0.0 for _, watts in self.points) or not self.blocking_w >= 0.0:
            raise ValueError(f"waiting power must be >= 0 W (got {self.blocking_w}, {self.points})")

    @property
    def constant(self) -> bool:
        """The same power at every clock: `blocking_w` (no points, or each at `blocking_w`)."""
        return all(watts == self.blocking_w for _, watts in self.points)

    def at_w(self, clock_mhz: int) -> float:
        """The waiting power while `clock_mhz` is held."""
        points = self.points
        if not points:
            return self.blocking_w
        if clock_mhz <= points[0][0]:
            return points[0][1]
        for (low_mhz, low_w), (high_mhz, high_w) in pairwise(points):
            if clock_mhz <= high_mhz:
                return low_w + (high_w - low_w) * (clock_mhz - low_mhz) / (high_mhz - low_mhz)
        return points[-1][1]


Held = tuple[int, float, float]
"""One computation as its waits see it: (clock MHz held, waiting W at it, its time at that clock s)."""


def held_waiting_j(
    dag: ComputationDag,
    times_s: Sequence[float],
    clocks_mhz: Sequence[int],
    time_s: float,
    waiting: WaitingPower,
    latency_s: float = 0.0,
) -> float:
    """The energy of every GPU's waits in an iteration of `time_s` when node i runs `times_s[i]` at
    `clocks_mhz[i]`, each wait at the clock held in it (`held_waits_j`)."""
    held = [(clock, waiting.at_w(clock), t) for clock, t in zip(clocks_mhz, times_s, strict=True)]
    return held_waits_j(dag, held, time_s, latency_s)


def held_waits_j(dag: ComputationDag, held: Sequence[Held], time_s: float, latency_s: float) -> float:
    """The waits' energy of an iteration of `time_s` whose node i is `held[i]`.

    Computations start as early as the DAG allows; a stage's wait before a computation is the time from the
    end of the one before it in the stage's order (its first computation's: from the last one's end in the
    previous iteration, the iterations `time_s` apart). That wait is held at the computation's clock, or
    for its first `latency_s` at the previous computation's clock when the clock is lowered. The waits of
    all stages add up to `num_stages * time_s` less the computations' times, as in `evaluate`. The switch
    core's C twin (`switch_core`, `trial_waits`) does these sums operation for operation."""
    start_s, finish_s = dag.earliest_s([node[2] for node in held])
    energy_j = 0.0
    for nodes in dag.stage_orders:
        for k, node in enumerate(nodes):
            before = nodes[k - 1]
            gap_s = max(0.0, start_s[node] - finish_s[before] + (time_s if k == 0 else 0.0))
            clock_mhz, waiting_w, _ = held[node]
            if clock_mhz < held[before][0]:
                early_s = min(gap_s, latency_s)
                energy_j += early_s * held[before][1] + (gap_s - early_s) * waiting_w
            else:
                energy_j += gap_s * waiting_w
    return energy_j


class HeldWaits:
    """`held_waits_j` through one DAG (nodes numbered stage by stage in schedule order) for many plans, in C
    where it was built (`_switchcore.Paths.held_waits`: the same sums in the same order, the same bits)."""

    def __init__(self, dag: ComputationDag, latency_s: float, use_c: bool = True) -> None:
        self.dag, self.latency_s = dag, latency_s
        paths = None if SWITCHCORE is None or not use_c else SWITCHCORE.Paths
        self._c = None if paths is None else paths(*dag_arrays(dag), stage_ptr=stage_ptr_of(dag))

    def __call__(
        self, clocks_mhz: Sequence[int], waits_w: Sequence[float], times_s: Sequence[float], time_s: float
    ) -> float:
        """The waits' energy of an iteration of `time_s` whose node i runs `times_s[i]` holding
        `clocks_mhz[i]`, waiting at `waits_w[i]`."""
        if self._c is not None:
            energy_j: float = self._c.held_waits(clocks_mhz, waits_w, times_s, time_s, self.latency_s)
            return energy_j
        held = list(zip(clocks_mhz, waits_w, times_s, strict=True))
        return held_waits_j(self.dag, held, time_s, self.latency_s)


def monotone_fit(values: Sequence[float], weights: Sequence[int]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent violators):
    each run of values that falls is replaced by its weighted mean."""
    blocks: list[tuple[float, int, int]] = []  # (weighted mean, weight, count of values)
    for value, weight in zip(values, weights, strict=True):
        mean, total, count = value, max(1, weight), 1
        while blocks and blocks[-1][0] > mean:
            previous, previous_total, previous_count = blocks.pop()
            mean = (previous * previous_total + mean * total) / (previous_total + total)
            total, count = previous_total + total, previous_count + count
        blocks.append((mean, total, count))
    return [mean for mean, _, count in blocks for _ in range(count)]


def pooled_by_clock(by_clock: Mapping[int, Sequence[float]]) -> tuple[tuple[int, float], ...]:
    """(MHz, W) ascending: per clock the median of its values, made to rise with the clock by `monotone_fit`
    (each clock weighted by how many values it has)."""
    clocks = sorted(by_clock)
    medians = [float(statistics.median(by_clock[clock_mhz])) for clock_mhz in clocks]
    fitted = monotone_fit(medians, [len(by_clock[clock_mhz]) for clock_mhz in clocks])
    return tuple(zip(clocks, fitted, strict=True))

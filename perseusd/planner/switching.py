"""Plans a GPU can follow: the clocks each computation will really run at, given the clock-switch latency.

A clock change is not instant: on an H100 a lock acts ~10 ms after it is asked for (the set call blocks about
that long), while computations last 7-45 ms. The daemon asks for a LOWER clock when the previous computation
ends, so the change acts `latency_s` into the next run of computations (a run: consecutive computations at
one clock); it asks for a HIGHER clock `lead_s` (the latency plus a margin) before the run before it is
expected to end, or at that run's begin when the run is shorter than `lead_s`. Per stage, going round its
computations in schedule order (the last one precedes the first of the next iteration), each clock boundary
of the plan is played out on that timeline, with each computation's time at its planned clock:

- lowering into a run: the run's first computations that run mostly before the change acts run at the
  previous, higher clock (energy the plan did not count);
- raising into a run: the change acts at `max(0, D - lead_s) + latency_s` into the run before it (D: that
  run's time). Computations of that run mostly after it run at the higher clock; when the run is shorter
  than `lead_s`, the raised run's first computations that run mostly before it run at the lower clock: the
  plan is slower than the solver thought.

A computation "runs at" the clock in force for most of its time. The result is what the GPU will really do
when the plan is deployed as it is; its predicted time and energy are what a frontier point is chosen by.
Waiting between computations (pipeline bubbles) gives a switch more time and is ignored (conservative).
Newer requests supersede older ones in the daemon, so requests never queue; this model assumes that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

TimeAt = Callable[[int, int], float]
"""(computation index in the stage's order, clock MHz) -> its time (s)."""
SnapUp = Callable[[int, int], int]
"""(computation index, clock MHz) -> its lowest measured clock at or above that clock (else its highest)."""


@dataclass(frozen=True)
class SwitchModel:
    """How a GPU switches clocks (s): a request acts `latency_s` after it is made; raises are made `lead_s`
    before the running computation's expected end."""

    latency_s: float
    lead_s: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.latency_s <= self.lead_s:
            raise ValueError(f"need 0 <= latency_s <= lead_s (got {self.latency_s}, {self.lead_s})")


def runs_of(clocks_mhz: Sequence[int]) -> list[list[int]]:
    """The cyclic runs of equal clocks, as lists of indices in order; one run when every clock is equal.

    The run that wraps (the last computations and the first ones of the next iteration) is one run.
    """
    n = len(clocks_mhz)
    starts = [i for i in range(n) if clocks_mhz[i] != clocks_mhz[i - 1]]
    if not starts:
        return [list(range(n))] if n else []
    runs = []
    for k, start in enumerate(starts):
        end = starts[(k + 1) % len(starts)]
        length = (end - start) % n or n
        runs.append([(start + j) % n for j in range(length)])
    return runs


def followable_stage_clocks(
    clocks_mhz: Sequence[int], time_at: TimeAt, snap_up: SnapUp, model: SwitchModel
) -> list[int]:
    """One stage's planned clocks (schedule order, cyclic) -> the clocks its computations really run at."""
    effective = list(clocks_mhz)
    runs = runs_of(clocks_mhz)
    if len(runs) < 2:
        return effective
    times_s = [time_at(i, clock) for i, clock in enumerate(clocks_mhz)]
    for k, run in enumerate(runs):
        before = runs[k - 1]
        before_mhz, own_mhz = clocks_mhz[before[0]], clocks_mhz[run[0]]
        if own_mhz < before_mhz:
            for i in _mostly_before(run, times_s, model.latency_s):
                effective[i] = snap_up(i, before_mhz)
            continue
        before_s = sum(times_s[i] for i in before)
        acts_s = max(0.0, before_s - model.lead_s) + model.latency_s
        for i in _mostly_after(before, times_s, acts_s):
            effective[i] = snap_up(i, own_mhz)
        for i in _mostly_before(run, times_s, acts_s - before_s):
            effective[i] = snap_up(i, before_mhz)
    return effective


def _mostly_before(run: list[int], times_s: list[float], acts_s: float) -> list[int]:
    """The computations of `run` (from its begin) that run mostly before `acts_s` after its begin."""
    elapsed_s = 0.0
    early = []
    for i in run:
        if elapsed_s + times_s[i] / 2 >= acts_s:
            break
        early.append(i)
        elapsed_s += times_s[i]
    return early


def _mostly_after(run: list[int], times_s: list[float], acts_s: float) -> list[int]:
    """The computations of `run` that run mostly after `acts_s` after its begin."""
    elapsed_s = 0.0
    late = []
    for i in run:
        if elapsed_s + times_s[i] / 2 >= acts_s:
            late.append(i)
        elapsed_s += times_s[i]
    return late


@dataclass(frozen=True)
class FollowablePoint:
    """A frontier point as the GPUs will really run it."""

    clocks_mhz: tuple[tuple[int, ...], ...]
    """Per stage, in schedule order: the clocks the computations will really run at."""
    changed: int
    """Computations that will not run at their planned clock."""


def followable_point(
    stage_clocks_mhz: Sequence[Sequence[int]],
    stage_time_at: Callable[[int], TimeAt],
    stage_snap_up: Callable[[int], SnapUp],
    model: SwitchModel,
) -> FollowablePoint:
    """Every stage's planned clocks -> what the GPUs will really run (`stage_time_at(s)`, `stage_snap_up(s)`:
    stage s's time and snapping functions)."""
    effective = []
    changed = 0
    for stage, clocks in enumerate(stage_clocks_mhz):
        really = followable_stage_clocks(clocks, stage_time_at(stage), stage_snap_up(stage), model)
        changed += sum(1 for old, new in zip(clocks, really, strict=True) if new != old)
        effective.append(tuple(really))
    return FollowablePoint(tuple(effective), changed)

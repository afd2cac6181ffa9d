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

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perseusd.planner.dag import ComputationDag
from perseusd.planner.profile import Profile

TimeAt = Callable[[int, int], float]
"""(computation index in the stage's order, clock MHz) -> its time (s)."""
SnapUp = Callable[[int, int], int]
"""(computation index, clock MHz) -> its lowest measured clock at or above that clock (else its highest)."""


@dataclass(frozen=True)
class SwitchModel:
    """How a GPU switches clocks (s): a request acts `latency_s` after it is made; raises are made `lead_s`
    before the run before them is expected to end (0: at its end)."""

    latency_s: float
    lead_s: float
    min_run_s: float = 0.0
    """Lowered runs shorter than this are merged into a higher neighbour before deployment (0: none)."""

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0.0 and self.lead_s >= 0.0):
            raise ValueError(f"need latency_s, lead_s >= 0 (got {self.latency_s}, {self.lead_s})")


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


def merged_stage_clocks(
    clocks_mhz: Sequence[int], time_at: TimeAt, snap_up: SnapUp, min_run_s: float
) -> list[int]:
    """One stage's planned clocks with every run shorter than `min_run_s` that is lower than a neighbouring
    run raised to the lower of its higher neighbours (it joins that run), shortest first, until none is left.

    A lowering acts `latency_s` late (or, early, costs slack), so a short lowered run saves little and makes
    its first computations begin before their clock is applied; raising it never slows the plan. Short runs
    higher than both neighbours stay (an early raise serves them)."""
    merged = list(clocks_mhz)
    while True:
        runs = runs_of(merged)
        if len(runs) < 2:
            return merged
        candidates = []
        for k, run in enumerate(runs):
            own_mhz = merged[run[0]]
            higher = [
                merged[runs[j][0]] for j in (k - 1, (k + 1) % len(runs)) if merged[runs[j][0]] > own_mhz
            ]
            run_s = sum(time_at(i, merged[i]) for i in run)
            if higher and run_s < min_run_s:
                candidates.append((run_s, k, min(higher)))
        if not candidates:
            return merged
        _, k, target_mhz = min(candidates)
        for i in runs[k]:
            merged[i] = snap_up(i, target_mhz)


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
    return _before(run, times_s, acts_s, 0.5)


def _before(run: list[int], times_s: list[float], acts_s: float, share: float) -> list[int]:
    """The computations of `run` (from its begin) whose first `share` of their time lies before `acts_s`
    after its begin (0.5: they run mostly before; 0: they begin before)."""
    elapsed_s = 0.0
    early = []
    for i in run:
        if elapsed_s + times_s[i] * share >= acts_s:
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


class StageOptions:
    """One stage's measured options, per computation in schedule order: its time and energy at each measured
    clock. Built once per job and profile; following a point and the descent read only these tables."""

    def __init__(self, dag: ComputationDag, profile: Profile, stage: int) -> None:
        self.time_s: list[dict[int, float]] = []
        self.energy_j: list[dict[int, float]] = []
        self.clocks_mhz: list[tuple[int, ...]] = []
        for node in dag.stage_orders[stage]:
            options = profile.options(dag.virtual_stage(node), dag.computations[node].instruction)
            self.time_s.append({m.freq_mhz: m.time_s for m in options})
            self.energy_j.append({m.freq_mhz: m.energy_j for m in options})
            self.clocks_mhz.append(tuple(sorted(self.time_s[-1])))
        self.all_clocks_mhz = tuple(sorted({c for clocks in self.clocks_mhz for c in clocks}))

    def time_at(self, k: int, clock_mhz: int) -> float:
        """Computation k's time at `clock_mhz` (snapped up to a measured clock)."""
        times = self.time_s[k]
        exact = times.get(clock_mhz)
        return exact if exact is not None else times[self.snap_up(k, clock_mhz)]

    def snap_up(self, k: int, clock_mhz: int) -> int:
        """Computation k's lowest measured clock at or above `clock_mhz`, else its highest."""
        clocks = self.clocks_mhz[k]
        at = bisect_left(clocks, clock_mhz)
        return clocks[at] if at < len(clocks) else clocks[-1]

    def top(self) -> tuple[int, ...]:
        """Every computation's highest measured clock."""
        return tuple(clocks[-1] for clocks in self.clocks_mhz)


def late_begins(clocks_mhz: Sequence[int], time_at: TimeAt, model: SwitchModel) -> int:
    """How many of one stage's computations (planned clocks, schedule order, cyclic) begin while another
    clock than their planned one is applied, on the model's timeline (each computation at its planned
    clock's time, back to back): a lowered run's computations until `latency_s` after its begin; a raised
    run's until the raise acts, when the run before it is shorter than `lead_s`; and the run before a raise,
    from when the raise acts (`max(0, D - lead_s) + latency_s` into it). What the daemon counts as begun
    before the clock was applied, less the lowerings it makes early where there is slack."""
    runs = runs_of(clocks_mhz)
    if len(runs) < 2:
        return 0
    times_s = [time_at(i, clock) for i, clock in enumerate(clocks_mhz)]
    late: set[int] = set()
    for k, run in enumerate(runs):
        before = runs[k - 1]
        if clocks_mhz[run[0]] < clocks_mhz[before[0]]:
            late.update(_begun_before(run, times_s, model.latency_s))
            continue
        before_s = sum(times_s[i] for i in before)
        acts_s = max(0.0, before_s - model.lead_s) + model.latency_s
        begun = set(_begun_before(before, times_s, acts_s))
        late.update(i for i in before if i not in begun)
        late.update(_begun_before(run, times_s, acts_s - before_s))
    return len(late)


def _begun_before(run: list[int], times_s: list[float], acts_s: float) -> list[int]:
    """The computations of `run` that begin before `acts_s` after its begin."""
    return _before(run, times_s, acts_s, 0.0)

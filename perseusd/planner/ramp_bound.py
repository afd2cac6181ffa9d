"""A bound on how fast a node's planned power ramps: the steps its clocks make between computations.

What is bounded. A GPU following a plan draws each computation's measured mean power at its planned clock
while it runs, and blocking power while it waits. Its power therefore steps at two kinds of moments:

- between one computation and the next on the GPU, by the difference of their powers: the *plan's steps*,
  which the planned clocks set;
- into and out of each wait (on a dependency, the all-reduce, idle), by a computation's power above blocking:
  the schedule's steps. All-max clocks make such waits too (deeper steps, wherever a computation's power grows
  with its clock); a plan cannot remove them without slowing the iteration, so they are not bounded.

The bound is on the node's *held power*: each GPU at the power of its current computation, held through the
wait after it until its next computation starts, so that only the plan's steps move it. Sampled as 10 ms
averages (`SAMPLE_S`), it changes by at most `limit_w_per_s` x 10 ms between any two consecutive samples, at
any phase of the sampling grid and however the node's GPUs (and pipelines) are aligned with each other.

How it is held. The change between two consecutive 10 ms averages is the sum of the steps within 10 ms of
their boundary, each weighted by at most 1. Each GPU's heaviest sum of |step| within any 20 ms with its
computations run back to back (its *window*; waits only spread its steps further apart, so no timing packs
them closer; the largest step alone when its computations last 20 ms or more) therefore bounds what it adds to
any sample's change, and the node's ramp is at most the sum of its GPUs' windows / 10 ms: `bound_ramps` holds
that sum within the limit, `bound_gpu_ramps` every GPU's window within its own slice (the daemon's way: on a
node of N GPUs, bound / N each, whatever jobs its GPUs run). Both raise clocks of the plan, one clock step at
a time and only ever to a clock no slower than the planned one, on the lower-power side of the largest step of
the GPU that weighs most, until the limit holds: the iteration never slows, and the energy spent is the
bound's cost. When no such raise helps any more, the computations of the GPUs still over go to their highest
clock no slower than planned (all-max on a profile whose times fall with the clock); a limit below what that
plan makes is not met (`met` False) and the lowest ramp found is kept.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import measurements_for
from perseusd.planner.profile import Measurement, Profile

SAMPLE_S = 0.01
"""The sampling interval the bound holds at (s): the 10 ms averages a facility's meter reads."""
TOLERANCE = 1e-9


@dataclass(frozen=True)
class RampBounded:
    """A plan's clocks with the ramp bound applied, and its ramps before and after (W/s)."""

    clocks_mhz: tuple[int, ...]
    """One clock per DAG node; each at least the planned one and its computation no slower."""
    planned_ramp_w_per_s: float
    ramp_w_per_s: float
    met: bool
    raised: int
    """Computations whose clock was raised."""


def window_w(steps: Sequence[tuple[float, float]], period_s: float, sample_s: float = SAMPLE_S) -> float:
    """The heaviest sum of |step| within any 2 x `sample_s` of a GPU whose steps repeat every `period_s`
    (an iteration shorter than that: every repeat the window holds counts)."""
    ordered = sorted(steps)
    copies = 1 + (math.ceil(2 * sample_s / period_s) if period_s > 0 else 0)
    times = [t + k * period_s for k in range(copies) for t, _ in ordered]
    sizes = [abs(w) for _, w in ordered] * copies
    best, total, end = 0.0, 0.0, 0
    for first in range(len(ordered)):
        while end < len(times) and times[end] < times[first] + 2 * sample_s:
            total += sizes[end]
            end += 1
        best = max(best, total)
        total -= sizes[first]
    return best


def plan_ramp_w_per_s(
    dag: ComputationDag,
    profile: Profile,
    clocks_mhz: Sequence[int],
    gpus_per_stage: Sequence[int] | None = None,
    sample_s: float = SAMPLE_S,
) -> float:
    """The plan's ramp bound (module): every GPU's window, weighted by the node's GPUs per stage, / sample."""
    return _Ramp(dag, gpus_per_stage, sample_s).ramp_w_per_s(measurements_for(dag, profile, clocks_mhz))


class _Ramp:
    """The ramp of one DAG's plans: per stage (GPU), its weighted window; their sum / sample."""

    def __init__(self, dag: ComputationDag, gpus_per_stage: Sequence[int] | None, sample_s: float) -> None:
        self.dag = dag
        self.weights = list(gpus_per_stage) if gpus_per_stage is not None else [1] * dag.num_stages
        if len(self.weights) != dag.num_stages or any(w < 0 for w in self.weights):
            raise ValueError("gpus_per_stage needs one count >= 0 per stage")
        self.sample_s = sample_s

    def windows_w(self, rows: Sequence[Measurement]) -> list[float]:
        return [self.stage_window_w(rows, stage) for stage in range(self.dag.num_stages)]

    def stage_window_w(self, rows: Sequence[Measurement], stage: int) -> float:
        """One GPU's weighted window, its computations back to back: a wait between two only spreads the
        steps after it further from those before, so no timing of the GPU's can pack them closer."""
        nodes = self.dag.stage_orders[stage]
        if not nodes or self.weights[stage] == 0:
            return 0.0
        powers = [power_w(rows[n]) for n in nodes]
        if min(rows[n].time_s for n in nodes) >= 2 * self.sample_s:  # steps 20 ms apart: the largest alone
            return self.weights[stage] * max(abs(powers[i] - powers[i - 1]) for i in range(len(nodes)))
        starts = list(itertools.accumulate((rows[n].time_s for n in nodes), initial=0.0))
        steps = [(starts[i], powers[i] - powers[i - 1]) for i in range(1, len(nodes))]
        steps.append((starts[-1], powers[0] - powers[-1]))  # the next iteration's first computation
        return self.weights[stage] * window_w(steps, starts[-1], self.sample_s)

    def ramp_w_per_s(self, rows: Sequence[Measurement]) -> float:
        return sum(self.windows_w(rows)) / self.sample_s


def power_w(row: Measurement) -> float:
    """A computation's mean power at its clock (W)."""
    return row.energy_j / row.time_s if row.time_s > 0 else 0.0


def _ladders(dag: ComputationDag, profile: Profile, clocks_mhz: Sequence[int]) -> list[list[Measurement]]:
    """Per node, its planned clock's row then every higher clock's no slower than it, clock ascending."""
    ladders = []
    for node, comp in enumerate(dag.computations):
        planned = profile.lookup(dag.virtual_stage(node), comp.instruction, clocks_mhz[node])
        higher = [
            m
            for m in profile.options(dag.virtual_stage(node), comp.instruction)
            if m.freq_mhz > planned.freq_mhz and m.time_s <= planned.time_s
        ]
        ladders.append([planned, *sorted(higher, key=lambda m: m.freq_mhz)])
    return ladders


def bound_ramps(
    dag: ComputationDag,
    profile: Profile,
    clocks_mhz: Sequence[int],
    limit_w_per_s: float,
    gpus_per_stage: Sequence[int] | None = None,
    sample_s: float = SAMPLE_S,
) -> RampBounded:
    """The plan `clocks_mhz` (one per node) with its ramp held within `limit_w_per_s` (see the module).

    `gpus_per_stage`: the node's GPUs running each stage (several pipelines or tensor-parallel GPUs; 0: the
    stage runs elsewhere and is not bounded here); None: one each."""
    return _bound(dag, profile, clocks_mhz, limit_w_per_s, _Ramp(dag, gpus_per_stage, sample_s), False)


def bound_gpu_ramps(
    dag: ComputationDag,
    profile: Profile,
    clocks_mhz: Sequence[int],
    limit_w_per_s: float,
    sample_s: float = SAMPLE_S,
) -> RampBounded:
    """The plan `clocks_mhz` with every GPU's (stage's) ramp held within `limit_w_per_s` alone: a node of N
    GPUs gives each bound / N, which holds the node's bound whatever jobs, pipelines and stages its GPUs run
    (the daemon's way). The ramps reported are the largest GPU's."""
    return _bound(dag, profile, clocks_mhz, limit_w_per_s, _Ramp(dag, None, sample_s), True)


def _bound(
    dag: ComputationDag,
    profile: Profile,
    clocks_mhz: Sequence[int],
    limit_w_per_s: float,
    ramp: _Ramp,
    each_gpu: bool,
) -> RampBounded:
    if not limit_w_per_s > 0:
        raise ValueError("the ramp limit must be positive (W/s)")
    limit_w = limit_w_per_s * ramp.sample_s * (1 + TOLERANCE)

    def excess_w(windows: Sequence[float]) -> float:
        if each_gpu:
            return sum(max(0.0, w - limit_w) for w in windows)
        return max(0.0, sum(windows) - limit_w)

    def over(windows: Sequence[float]) -> list[int]:
        """The stages a raise may help: those over the limit alone, or every stage bounded here."""
        return [s for s, w in enumerate(windows) if (w > limit_w if each_gpu else ramp.weights[s] > 0)]

    ladders = _ladders(dag, profile, clocks_mhz)
    rung = [0] * dag.num_computations
    rows = [ladder[0] for ladder in ladders]
    windows = ramp.windows_w(rows)
    planned = list(windows)
    while excess_w(windows) > 0:
        node = _next_raise(dag, over(windows), windows, rows, rung, ladders)
        if node is None:
            break
        rung[node] += 1
        rows[node] = ladders[node][rung[node]]
        stage = dag.computations[node].stage
        windows[stage] = ramp.stage_window_w(rows, stage)  # a raise moves its own GPU's steps alone
    if excess_w(windows) > 0:  # stuck: every computation there at its highest clock no slower than planned
        stuck = set(over(windows))
        top = [
            ladder[-1] if c.stage in stuck else row
            for ladder, row, c in zip(ladders, rows, dag.computations, strict=True)
        ]
        if excess_w(ramp.windows_w(top)) < excess_w(windows):
            rows, windows = top, ramp.windows_w(top)
    clocks = tuple(m.freq_mhz for m in rows)
    raised = sum(1 for a, b in zip(clocks, clocks_mhz, strict=True) if a != b)

    def measure_w_per_s(windows: Sequence[float]) -> float:
        return (max(windows, default=0.0) if each_gpu else sum(windows)) / ramp.sample_s

    met = excess_w(windows) == 0
    return RampBounded(clocks, measure_w_per_s(planned), measure_w_per_s(windows), met, raised)


def _next_raise(
    dag: ComputationDag,
    stages: Sequence[int],
    windows: Sequence[float],
    rows: Sequence[Measurement],
    rung: Sequence[int],
    ladders: Sequence[Sequence[Measurement]],
) -> int | None:
    """The computation to raise one clock step: in the one of `stages` that weighs most, the lower-power side
    of its largest step that can still rise, whose rise shrinks that step (None: no such computation)."""
    for stage in sorted(stages, key=lambda s: -windows[s]):
        if windows[stage] <= 0:
            continue
        nodes = dag.stage_orders[stage]
        pairs = [(nodes[i - 1], nodes[i]) for i in range(len(nodes))]  # i = 0: the wrap-around step
        power = {n: power_w(rows[n]) for n in nodes}
        for a, b in sorted(pairs, key=lambda p: -abs(power[p[1]] - power[p[0]])):
            low, high = (a, b) if power[a] < power[b] else (b, a)
            if rung[low] + 1 < len(ladders[low]):
                step_w = abs(power[high] - power_w(ladders[low][rung[low] + 1]))
                if step_w < abs(power[high] - power[low]):
                    return low
    return None

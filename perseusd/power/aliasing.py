"""Node power over a window that is not a whole number of iterations.

An iteration's power is not flat (pipeline bubbles at its start and end), so a window of 1 s over 0.42 s
iterations can hold more of the dense middle than the average says. For a point the node cap therefore
budgets the worst window of the periodic power its plan draws: n whole iterations plus the densest slice of
the rest, from the iteration's schedule (each computation's start, end and power).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from perseusd.planner.dag import ComputationDag

Segment = tuple[float, float, float]
"""(start s, end s, power above the blocking power W)."""


def max_window_energy_j(segments: Sequence[Segment], from_s: float, to_s: float, width_s: float) -> float:
    """The most energy (J, above blocking) any [t, t + width_s] with from_s <= t <= to_s holds."""
    events: dict[float, float] = {}
    for begin_s, end_s, extra_w in segments:
        events[begin_s] = events.get(begin_s, 0.0) + extra_w
        events[end_s] = events.get(end_s, 0.0) - extra_w
    if not events:
        return 0.0
    times = sorted(events)
    cumulative = [0.0]
    level_w = 0.0
    for i in range(1, len(times)):
        level_w += events[times[i - 1]]
        cumulative.append(cumulative[-1] + level_w * (times[i] - times[i - 1]))

    def energy_at(t_s: float) -> float:
        if t_s <= times[0]:
            return 0.0
        if t_s >= times[-1]:
            return cumulative[-1]
        hi = bisect.bisect_right(times, t_s)
        lo = hi - 1
        rate_w = (cumulative[hi] - cumulative[lo]) / (times[hi] - times[lo])
        return cumulative[lo] + rate_w * (t_s - times[lo])

    starts = [from_s, to_s]
    starts += [t for t in times if from_s <= t <= to_s]
    starts += [t - width_s for t in times if from_s <= t - width_s <= to_s]
    return max(energy_at(s + width_s) - energy_at(s) for s in starts)


def periodic_worst_window_w(
    segments: Sequence[Segment], period_s: float, base_w: float, window_s: float
) -> float:
    """The worst average power over `window_s` of a power that repeats every `period_s` (see the module)."""
    if not period_s > 0:
        return base_w
    whole = math.floor(window_s / period_s)
    rest_s = window_s - whole * period_s
    per_iteration_j = sum((end - begin) * extra for begin, end, extra in segments)
    repeated = [*segments, *((b + period_s, e + period_s, w) for b, e, w in segments)]
    rest_j = max_window_energy_j(repeated, 0.0, period_s, rest_s) if rest_s > 0 else 0.0
    return base_w + (whole * per_iteration_j + rest_j) / window_s


def schedule(
    dag: ComputationDag, durations_s: Sequence[float], powers_w: Sequence[float], p_block_w: float
) -> tuple[float, list[list[Segment]]]:
    """One iteration's longest-path schedule: its time and each stage's segments (power above blocking)."""
    finish = [0.0] * dag.num_computations
    per_stage: list[list[Segment]] = [[] for _ in range(dag.num_stages)]
    for node in dag.topological_order:
        begin_s = max((finish[p] for p in dag.predecessors[node]), default=0.0)
        finish[node] = begin_s + durations_s[node]
        per_stage[dag.computations[node].stage].append((begin_s, finish[node], powers_w[node] - p_block_w))
    return max(finish, default=0.0), per_stage

"""The best hard line: per-GPU power limits that sum to at most a grant, chosen on the job's DAG.

A hard line in the strict sense holds each GPU's power under its NVML limit at every moment the limit's
controller acts on (tens of ms on an H100, `power-limit-sweep.csv`), so the node cannot draw more than the
sum of the limits, whatever runs. Which split of the grant costs the least iteration time depends on the
job: a computation whose power at its planned clock is above its GPU's limit runs at the highest clock that
fits (the board's capping), and the iteration is the DAG's longest path over those capped durations.

`search_limits` starts from each GPU's need (its plan's peak) and lowers, step by step, the limit whose step
costs the least iteration time, until the limits sum to the grant. `best_hard_line` does that for several
frontier points and keeps the fastest. Offline only (the benchmark and `perseusctl cap model`): each step
models the whole DAG.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perseusd.power.cap_inputs import GpuRange

TimeUnder = Callable[[dict[str, float]], float]
"""Iteration time (s) of a plan under per-GPU power limits (W)."""


@dataclass(frozen=True)
class HardLine:
    index: int
    """The frontier point whose clocks run under the limits."""
    time_s: float
    limits_w: dict[str, float]

    @property
    def sum_w(self) -> float:
        return sum(self.limits_w.values())


def search_limits(
    gpus: Sequence[GpuRange], needs_w: dict[str, float], grant_w: float, time_under: TimeUnder, step_w: float
) -> dict[str, float] | None:
    """Limits summing to at most `grant_w`, each within its GPU's range, lowered greedily from `needs_w`
    (least iteration time lost per step); None when even the minimum limits do not fit."""
    if sum(g.min_w for g in gpus) > grant_w:
        return None
    limits = {g.uuid: min(max(needs_w.get(g.uuid, g.max_w), g.min_w), g.max_w) for g in gpus}
    floors = {g.uuid: g.min_w for g in gpus}
    while sum(limits.values()) > grant_w + 1e-9:
        excess_w = sum(limits.values()) - grant_w
        best: tuple[float, str, float] | None = None
        for uuid, limit_w in limits.items():
            cut_w = min(step_w, excess_w, limit_w - floors[uuid])
            if cut_w <= 1e-9:
                continue
            trial = dict(limits)
            trial[uuid] -= cut_w
            time_s = time_under(trial)
            if best is None or (time_s, -cut_w) < (best[0], -best[2]):
                best = (time_s, uuid, cut_w)
        if best is None:
            return None
        limits[best[1]] -= best[2]
    return limits


def best_hard_line(
    gpus: Sequence[GpuRange],
    candidates: Sequence[tuple[int, dict[str, float], TimeUnder]],
    grant_w: float,
    step_w: float = 10.0,
) -> HardLine | None:
    """The fastest of `candidates` (point index, each GPU's need, its time under limits) under limits summing
    to at most `grant_w`; None when no GPU split fits (the grant is below the minimum limits)."""
    best: HardLine | None = None
    for index, needs_w, time_under in candidates:
        limits = search_limits(gpus, needs_w, grant_w, time_under, step_w)
        if limits is None:
            continue
        time_s = time_under(limits)
        if best is None or time_s < best.time_s:
            best = HardLine(index, time_s, limits)
    return best

"""What the node cap's allocation takes: each GPU's power-limit range and each job's frontier points as the
cap sees them (`perseusd.power.allocate` allocates; `perseusd.power.limit_fit` fits limits below the
peaks)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perseusd.planner.policy import PointSummary

if TYPE_CHECKING:
    from perseusd.power.limit_model import LimitModel


@dataclass(frozen=True)
class GpuRange:
    """One GPU's power-limit constraints (W)."""

    uuid: str
    min_w: float
    max_w: float


@dataclass(frozen=True)
class CapPoint:
    """One frontier point of a job as the cap sees it: iteration time and each of the job's GPUs' power."""

    index: int
    time_s: float
    power_w: Mapping[str, float]
    """Average power per GPU (W) over an iteration."""
    peak_w: Mapping[str, float]
    """Power of each GPU's most power-hungry computation at this point (W)."""
    window_w: float = 0.0
    """The job's worst power over an enforcement window on this node (W, `perseusd.power.aliasing`);
    0: not known, the average is budgeted."""

    @property
    def total_w(self) -> float:
        """What the cap budgets for this point: the worst window when known, else the average."""
        return max(sum(self.power_w.values()), self.window_w)


@dataclass(frozen=True)
class JobLoad:
    """A job running a plan: its priority, its points and the point it would run uncapped."""

    name: str
    priority: int
    points: tuple[CapPoint, ...]
    base_index: int
    """The point its policy (and straggler slack) chooses: the cap only ever slows it from there."""
    limit_model: Callable[[int], LimitModel | None] | None = field(default=None, compare=False, repr=False)
    """The job at a point under power limits (`perseusd.power.limit_model`); None: not modelled."""

    def sorted_points(self) -> list[CapPoint]:
        """Fastest first, then by lower power."""
        return sorted(self.points, key=lambda p: (p.time_s, p.total_w))

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(self.points[0].power_w) if self.points else ()


def candidate_indices(points: Sequence[PointSummary], count: int) -> list[int]:
    """Up to `count` points spread evenly in iteration time (the fastest and slowest always among them)."""
    ordered = sorted(points, key=lambda p: (p.time_s, p.energy_j))
    if len(ordered) <= count:
        return [p.index for p in ordered]
    fastest_s, slowest_s = ordered[0].time_s, ordered[-1].time_s
    chosen: dict[int, None] = {}
    at = 0
    for k in range(count):
        target_s = fastest_s + (slowest_s - fastest_s) * k / (count - 1)
        while at < len(ordered) - 1 and ordered[at].time_s < target_s:
            at += 1
        chosen[ordered[at].index] = None
    chosen[ordered[-1].index] = None
    return list(chosen)

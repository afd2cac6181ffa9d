"""Which frontier point a job runs: the deployment policy.

- `no_slowdown` (default): the least energy whose predicted iteration time is no longer than all-max's
  (every computation at its highest clock). On a GPU whose top clocks are power-capped the fastest point is
  faster than all-max, and buying that speed costs energy; this point never does. Without an all-max
  reference it is the fastest point;
- `fastest`: the fastest point, the lower energy on equal times;
- `slowdown`: the least energy among points at most `target` (a fraction) slower than the fastest;
- `time`: the least energy among points whose iteration time is at most `target` seconds (the fastest
  when none is that fast), in measured seconds: the target is compared with a point's predicted time plus
  the job's measured iteration overhead (time outside the computations the plan knows:
  `Job.iteration_overhead_s`);
- `min_energy`: the least energy of all points;
- `carbon`: follows the grid (docs/carbon.md): every interval the point of least Chase cost among those at
  most `target` (a fraction) slower than all-max, chosen by `perseusd.jobs.carbon_steering`; while the node
  has no usable grid signal it runs its default point, `no_slowdown`'s, which is what `choose` returns.

Energies are the frontier's (computation energy plus blocking power while waiting inside the iteration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from perseus_client.message import Policy as PolicyName

from perseusd.errors import InvalidValueError

POLICIES: tuple[str, ...] = get_args(PolicyName)
"""Every policy name, from the wire protocol's `Policy` literal."""
DEFAULT_POLICY = "no_slowdown"
TOLERANCE = 1e-9
"""Relative slack on time limits, so a point equal to its limit up to rounding still fits."""


@dataclass(frozen=True)
class PointSummary:
    """One frontier point as the policy sees it."""

    index: int
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class Policy:
    name: str = DEFAULT_POLICY
    target: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise InvalidValueError(f"policy must be one of {', '.join(POLICIES)}")
        if self.name in ("slowdown", "carbon") and not 0.0 <= self.target <= 10.0:
            raise InvalidValueError(f"{self.name} target is a slowdown fraction 0..10 (0.05 = 5 %)")
        if self.name == "time" and not self.target > 0.0:
            raise InvalidValueError("time target must be > 0 seconds")

    def choose(
        self, points: list[PointSummary], all_max_time_s: float | None = None, overhead_s: float = 0.0
    ) -> PointSummary:
        """The point this policy runs; `points` must not be empty. `all_max_time_s`: the predicted iteration
        time at all-max clocks on the same profile (`no_slowdown`'s limit; None: unknown). `overhead_s`: what
        an iteration measures beyond its predicted time (`time` targets are measured seconds)."""
        fastest = min(points, key=lambda p: (p.time_s, p.energy_j))
        if self.name == "fastest":
            return fastest
        if self.name in ("no_slowdown", "carbon"):
            if all_max_time_s is None:
                return fastest
            limit_s = all_max_time_s * (1 + TOLERANCE)
        elif self.name == "slowdown":
            limit_s = fastest.time_s * (1.0 + self.target) * (1 + 1e-12)
        elif self.name == "time":
            limit_s = (self.target - overhead_s) * (1 + TOLERANCE)
        else:
            limit_s = float("inf")
        fitting = [p for p in points if p.time_s <= limit_s]
        if not fitting:
            return fastest
        return min(fitting, key=lambda p: (p.energy_j, p.time_s))

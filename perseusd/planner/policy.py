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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import get_args

from perseus_client.message import Policy as PolicyName

from perseusd.errors import InvalidValueError

DEFAULT_POLICY = "no_slowdown"
TOLERANCE = 1e-9
"""Relative slack on time limits, so a point equal to its limit up to rounding still fits."""


@dataclass(frozen=True)
class Target:
    """What a policy's `target` is: a slowdown fraction (shown and typed as a percentage) or seconds."""

    what: str
    """How `perseusctl` asks for it ("a slowdown such as 5% or 0.05")."""
    percent: bool
    positive: bool = False
    """Zero is not a target (seconds); else 0 is allowed."""
    maximum: float = float("inf")
    error: str = ""
    """Why the daemon refuses a target out of range ({name}: the policy)."""

    def allows(self, value: float) -> bool:
        return (value > 0.0 if self.positive else value >= 0.0) and value <= self.maximum

    def label(self, value: float) -> str:
        """`5 %` or `3.2 s`: the target in its unit."""
        return f"{100.0 * value:g} %" if self.percent else f"{value:g} s"


SLOWDOWN = Target(
    "a slowdown such as 5% or 0.05",
    percent=True,
    maximum=10.0,
    error="{name} target is a slowdown fraction 0..10 (0.05 = 5 %)",
)
SECONDS = Target(
    "seconds per iteration such as 3.2",
    percent=False,
    positive=True,
    error="{name} target must be > 0 seconds",
)


@dataclass(frozen=True)
class Limits:
    """What a policy's time limit may depend on: the fastest point's time, all-max's (None: unknown), its
    target and the job's measured overhead per iteration."""

    fastest_s: float
    all_max_s: float | None
    target: float
    overhead_s: float


@dataclass(frozen=True)
class PolicySpec:
    """One policy: the longest predicted iteration time it accepts (None: the fastest point); its target."""

    name: str
    limit_s: Callable[[Limits], float | None]
    """The least energy among points no slower than this runs (the fastest point when none is)."""
    target: Target | None = None
    target_required: bool = True
    """Without a target the policy cannot choose (else its target defaults to 0)."""
    no_harm: bool = False
    """It promises no slowdown and chooses by energy alone, so a stage whose plan would not measurably save
    runs one clock instead (do no harm, `perseusd.jobs.no_harm`)."""


def _no_slowdown(limits: Limits) -> float | None:
    return None if limits.all_max_s is None else limits.all_max_s * (1 + TOLERANCE)


_REGISTERED = (
    PolicySpec("no_slowdown", _no_slowdown, no_harm=True),
    PolicySpec("fastest", lambda _limits: None),
    PolicySpec("slowdown", lambda x: x.fastest_s * (1.0 + x.target) * (1 + 1e-12), SLOWDOWN),
    PolicySpec("time", lambda x: (x.target - x.overhead_s) * (1 + TOLERANCE), SECONDS),
    PolicySpec("min_energy", lambda _limits: float("inf")),
    # the carbon steering (`perseusd.jobs.carbon_steering`) chooses within the target; this is its default
    PolicySpec(
        "carbon", _no_slowdown, replace(SLOWDOWN, what="an allowed slowdown such as 5% or 0.05"), False
    ),
)
REGISTRY: Mapping[str, PolicySpec] = {spec.name: spec for spec in _REGISTERED}
"""Every policy by its wire name: the one place a policy is added (with its name in the protocol's
`Policy`, and its tests)."""
POLICIES: tuple[str, ...] = get_args(PolicyName)
"""Every policy name, from the wire protocol's `Policy` literal (a test checks `REGISTRY` has them all)."""


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
        if self.name not in REGISTRY:
            raise InvalidValueError(f"policy must be one of {', '.join(POLICIES)}")
        target = REGISTRY[self.name].target
        if target is not None and not target.allows(self.target):
            raise InvalidValueError(target.error.format(name=self.name))

    def choose(
        self, points: list[PointSummary], all_max_time_s: float | None = None, overhead_s: float = 0.0
    ) -> PointSummary:
        """The point this policy runs; `points` must not be empty. `all_max_time_s`: the predicted iteration
        time at all-max clocks on the same profile (`no_slowdown`'s limit; None: unknown). `overhead_s`: what
        an iteration measures beyond its predicted time (`time` targets are measured seconds)."""
        fastest = min(points, key=lambda p: (p.time_s, p.energy_j))
        limit_s = REGISTRY[self.name].limit_s(Limits(fastest.time_s, all_max_time_s, self.target, overhead_s))
        fitting = [] if limit_s is None else [p for p in points if p.time_s <= limit_s]
        if not fitting:
            return fastest
        return min(fitting, key=lambda p: (p.energy_j, p.time_s))

"""Dividing a pool's budget among its nodes, and moving grants without ever exceeding it (pure, no I/O).

`allocate`: floors first; then what each node asks above its floor, tier by tier (the highest priority tier
first), proportionally within a tier; never above a node's demand. Budget left once every demand is met is
kept back (a node's demand rising is served at the next allocation). A budget below the sum of the floors
cannot be met: the allocation says so and divides the budget in proportion to the floors (every grant is
then below its node's floor; the node holds its floor and the shortfall is reported, never hidden).

`plan_moves`: from the grants in etcd to new targets in two steps, lowers first (with the grants of nodes
that left deleted), then raises. After the first step every grant is at most its target, so the sum is at
most the new budget at every revision in between.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

GRANT_RESOLUTION_W = 0.1
"""Grants are rounded down to this, so rounding never lifts their sum above the budget."""


@dataclass(frozen=True)
class NodeNeed:
    """What one node asks of the pool (W)."""

    node: str
    demand_w: float
    floor_w: float
    priority_w: Mapping[int, float] = field(default_factory=dict)
    """Demand above the floor per priority tier (0 = lowest); what it leaves out of demand - floor is tier 0,
    and more than demand - floor in all is scaled down to it."""

    def __post_init__(self) -> None:
        values = (self.demand_w, self.floor_w, *self.priority_w.values())
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"node {self.node}: power figures must be finite and >= 0")
        if self.floor_w > self.demand_w:
            raise ValueError(f"node {self.node}: floor {self.floor_w} W above demand {self.demand_w} W")

    def tiers_w(self) -> dict[int, float]:
        """The demand above the floor by tier, summing to exactly demand - floor."""
        extra_w = self.demand_w - self.floor_w
        listed = {t: w for t, w in self.priority_w.items() if w > 0}
        total_w = sum(listed.values())
        if total_w > extra_w:
            return {t: w * extra_w / total_w for t, w in listed.items()}
        tiers = dict(listed)
        if extra_w - total_w > 0:
            tiers[0] = tiers.get(0, 0.0) + extra_w - total_w
        return tiers


@dataclass(frozen=True)
class Allocation:
    """Each node's grant (W), and whether the budget covers the floors."""

    budget_w: float
    grants_w: dict[str, float]
    floors_w: float
    demand_w: float
    reserved_w: float = 0.0
    """Held out of the budget for absent nodes (their GPUs may still draw it)."""

    @property
    def available_w(self) -> float:
        """What is divided among the nodes: the budget less the reservations."""
        return max(0.0, self.budget_w - self.reserved_w)

    @property
    def feasible(self) -> bool:
        return self.floors_w <= self.available_w

    @property
    def problem(self) -> str | None:
        """Why the budget cannot be met (None when it can)."""
        if self.feasible:
            return None
        budget = f"budget {self.budget_w:.1f} W"
        if self.reserved_w > 0:
            budget += f" less {self.reserved_w:.1f} W reserved for absent nodes"
        return (
            f"{budget} is below the sum of the nodes' floors {self.floors_w:.1f} W "
            "(slowest points and minimum power limits): it cannot be met; grants are proportional to the "
            "floors and every node holds its floor"
        )


def allocate(budget_w: float, needs: list[NodeNeed], reserved_w: float = 0.0) -> Allocation:
    """Divide `budget_w`, less `reserved_w` (absent nodes' grants), among `needs` (see module)."""
    if not math.isfinite(budget_w) or budget_w < 0:
        raise ValueError(f"budget must be finite and >= 0, not {budget_w}")
    if not math.isfinite(reserved_w) or reserved_w < 0:
        raise ValueError(f"reserved power must be finite and >= 0, not {reserved_w}")
    full_w, budget_w = budget_w, max(0.0, budget_w - reserved_w)
    floors_w = sum(n.floor_w for n in needs)
    demand_w = sum(n.demand_w for n in needs)
    if floors_w > budget_w:
        grants = {n.node: _down(n.floor_w * budget_w / floors_w) for n in needs}
        return Allocation(full_w, grants, floors_w, demand_w, reserved_w)
    given = {n.node: n.floor_w for n in needs}
    left_w = budget_w - floors_w
    tiers = {n.node: n.tiers_w() for n in needs}
    for tier in sorted({t for asked in tiers.values() for t in asked}, reverse=True):
        asked = {node: t[tier] for node, t in tiers.items() if t.get(tier, 0.0) > 0}
        asked_w = sum(asked.values())
        share = 1.0 if asked_w <= left_w else left_w / asked_w
        for node, want_w in asked.items():
            given[node] += want_w * share
        left_w = max(0.0, left_w - asked_w * share)
        if left_w <= 0:
            break
    demand = {n.node: n.demand_w for n in needs}
    grants = {node: _down(min(w, demand[node])) for node, w in given.items()}
    return Allocation(full_w, grants, floors_w, demand_w, reserved_w)


@dataclass(frozen=True)
class Moves:
    """Two steps from the current grants to the targets: `lowers` (and `drops`) first, then `raises`."""

    lowers: dict[str, float]
    drops: tuple[str, ...]
    raises: dict[str, float]

    @property
    def settled(self) -> bool:
        return not (self.lowers or self.drops or self.raises)


def plan_moves(current_w: Mapping[str, float], target_w: Mapping[str, float]) -> Moves:
    """Lower what is above target, drop grants of nodes not in `target_w`, raise what is below target."""
    lowers = {n: t for n, t in target_w.items() if n in current_w and t < current_w[n]}
    raises = {n: t for n, t in target_w.items() if t > current_w.get(n, -1.0)}
    drops = tuple(sorted(n for n in current_w if n not in target_w))
    return Moves(lowers, drops, raises)


def _down(value_w: float) -> float:
    """Round down to the grant resolution (a hair of float error is forgiven first)."""
    steps = math.floor(value_w / GRANT_RESOLUTION_W + 1e-9)
    return round(steps * GRANT_RESOLUTION_W, 3)

"""`NodePowerTarget`: what a node offers a power budget (the node cap or the cluster pool drives it)."""

from __future__ import annotations

from typing import Protocol


class NodePowerTarget(Protocol):
    def power_demand_w(self) -> float:
        """Node power with every job at its fastest point (GPUs with no job: their max power limit)."""
        ...

    def power_floor_w(self) -> float:
        """Least power the node can be held to (slowest points / min power limits)."""
        ...

    def priority_demand_w(self) -> dict[int, float]:
        """Demand above floor per priority tier (0 = lowest)."""
        ...

    def apply_grant_w(self, grant_w: float | None) -> None:
        """None = no grant (uncapped); must be safe to call from any thread."""
        ...

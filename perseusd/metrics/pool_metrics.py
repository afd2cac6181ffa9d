"""This node's cluster power pool as metrics (only when the node is in a pool): the active budget, its grant,
what it holds, and the budget's age and signal state (an admin's budget, or a facility controller's signal
that may go stale; docs/power-pool.md)."""

from __future__ import annotations

from collections.abc import Iterator

from perseus_client.status_messages import PoolInfo
from prometheus_client.core import Metric

from perseusd.metrics.families import add_known, add_state_set, gauge

SIGNAL_STATES = ("fresh", "stale: last grants held", "stale: safe caps")


def pool_families(pool: PoolInfo) -> Iterator[Metric]:
    budget = gauge("power_pool_budget_watts", "The pool's active budget as this node last read it", ("pool",))
    grant = gauge("power_pool_grant_watts", "This node's grant", ("pool",))
    held = gauge(
        "power_pool_held_watts", "What this node holds now (grant, last grant or safe cap)", ("pool",)
    )
    age = gauge(
        "power_pool_budget_age_seconds",
        "Seconds since the requested budget was set or its facility signal issued",
        ("pool", "source"),
    )
    state = gauge(
        "power_pool_budget_signal", "1 for the budget signal's state, 0 for the others", ("pool", "state")
    )
    for family, value in ((budget, pool.budget_w), (grant, pool.grant_w), (held, pool.applied_w)):
        add_known(family, [pool.pool], value)
    add_known(age, [pool.pool, pool.budget_by or ""], pool.budget_age_s)
    if pool.budget_signal is not None:
        add_state_set(state, [pool.pool], SIGNAL_STATES, pool.budget_signal)
    yield from (budget, grant, held, age, state)

"""The admin's side of a power pool: set (or clear) its budget, read its status. Blocking etcd calls: for
the daemon's admin requests and tools, never for the hot path.

Setting a budget writes the pool's requested budget (with who set it); the allocator then moves the grants
(lowers first) and makes it the active budget in the same transaction as the moves that make it true, so the
status shows both until they agree.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from perseusd.cluster.etcd_store import EtcdStore, put_op
from perseusd.pool.alloc import allocate
from perseusd.pool.keys import Budget, PoolKeys
from perseusd.pool.view import read_pool

logger = logging.getLogger(__name__)

MAX_BUDGET_W = 1e9


def set_budget(store: EtcdStore, keys: PoolKeys, budget_w: float | None, by: str) -> None:
    """Request `budget_w` for the pool (None: no budget, every node uncapped); logged with `by`.

    Raises:
        ValueError: the budget is not a finite number of watts in [0, 1 GW].
        ClusterError: etcd could not be reached.
    """
    if budget_w is None:
        store.delete(keys.request)
        logger.warning("power pool %s: budget cleared by %s", keys.pool, by)
        return
    if not math.isfinite(budget_w) or not 0 <= budget_w <= MAX_BUDGET_W:
        raise ValueError(f"budget must be 0..{MAX_BUDGET_W:.0f} W, not {budget_w}")
    store.txn([], [put_op(keys.request, Budget(budget_w, by, time.time()).encode())])
    logger.warning("power pool %s: budget set to %.1f W by %s", keys.pool, budget_w, by)


@dataclass(frozen=True)
class NodeStatus:
    node: str
    grant_w: float | None
    demand_w: float
    floor_w: float
    applied_w: float | None
    power_w: float | None
    priority_w: dict[int, float]


@dataclass(frozen=True)
class PoolStatus:
    """A pool as of one etcd revision."""

    pool: str
    revision: int
    requested_w: float | None
    requested_by: str
    active_w: float | None
    granted_w: float
    allocator: str | None
    nodes: tuple[NodeStatus, ...]
    problem: str | None
    requested_age_s: float | None = None
    signal: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "pool": self.pool,
            "revision": self.revision,
            "requested_w": self.requested_w,
            "requested_by": self.requested_by,
            "active_w": self.active_w,
            "granted_w": self.granted_w,
            "allocator": self.allocator,
            "problem": self.problem,
            "requested_age_s": self.requested_age_s,
            "signal": self.signal,
            "nodes": [
                {
                    "node": n.node,
                    "grant_w": n.grant_w,
                    "demand_w": n.demand_w,
                    "floor_w": n.floor_w,
                    "applied_w": n.applied_w,
                    "power_w": n.power_w,
                    "priority_w": {str(t): w for t, w in sorted(n.priority_w.items())},
                }
                for n in self.nodes
            ],
        }


def pool_status(store: EtcdStore, keys: PoolKeys) -> PoolStatus:
    """The pool's budget (requested, active), grants, and each node's report (ClusterError if unreachable)."""
    revision, entries = store.range_prefix(keys.root)
    view = read_pool(keys, revision, entries)
    now_s = time.time()
    nodes = []
    for node in sorted(set(view.reports) | set(view.grants)):
        report = view.reports.get(node)
        grant = view.grants.get(node)
        nodes.append(
            NodeStatus(
                node,
                None if grant is None else grant.grant_w,
                report.report.demand_w if report else 0.0,
                report.report.floor_w if report else 0.0,
                report.report.applied_w if report else None,
                report.report.power_w if report else None,
                dict(report.report.priority_w) if report else {},
            )
        )
    problem = None
    if view.request is not None:
        needs = [r.report.need(n) for n, r in sorted(view.reports.items())]
        problem = allocate(view.request.budget_w, needs).problem
    return PoolStatus(
        keys.pool,
        revision,
        None if view.request is None else view.request.budget_w,
        "" if view.request is None else view.request.by,
        None if view.active is None else view.active.budget_w,
        round(view.granted_w, 3),
        view.allocator_node,
        tuple(nodes),
        problem,
        None if view.request is None else round(max(0.0, now_s - view.request.at_s), 1),
        None if view.request is None else view.request.freshness(now_s),
    )

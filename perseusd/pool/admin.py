"""The admin's side of a power pool: set (or clear) its budget, release an absent node's reservation, read
its status. Blocking etcd calls: for
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

from perseusd.cluster.etcd_store import EtcdStore, compare_create, compare_mod, delete_op, put_op
from perseusd.pool.alloc import allocate
from perseusd.pool.keys import Budget, PoolKeys, decode_grant_record
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


class ReleaseRefusedError(ValueError):
    """The node reports to the pool (alive), or has no grant to release."""


def release_node(store: EtcdStore, keys: PoolKeys, node: str, by: str) -> float:
    """End an absent node's reservation: its grant is deleted in one transaction that holds only while the
    node has no report (an admin's word that its GPUs no longer draw it: powered off, fenced, limits reset).
    The allocator hands the share to the others at its next round. Returns the released grant (W).

    Raises:
        ReleaseRefusedError: the node reports (it is alive: its share moves with the budget), or it has no
            grant in the pool (unknown, or released already).
        ClusterError: etcd could not be reached.
    """
    node_key, grant_key = keys.node(node), keys.grant(node)
    for _ in range(3):  # the grant may be rewritten (its absence marked) between the read and the write
        _revision, entries = store.read_ranges([(node_key, None), (grant_key, None)])
        found = {e.key: e for e in entries}
        if node_key in found:
            raise ReleaseRefusedError(
                f"node {node} reports to pool {keys.pool} (it is alive): only an absent node's grant can be "
                "released; a live node's share moves with the budget"
            )
        grant = found.get(grant_key)
        if grant is None:
            raise ReleaseRefusedError(
                f"node {node} has no grant in pool {keys.pool} (unknown, or released already)"
            )
        record = decode_grant_record(grant.value)
        released, _ = store.txn(
            [compare_create(node_key, 0), compare_mod(grant_key, grant.mod_revision)], [delete_op(grant_key)]
        )
        if released:
            logger.warning(
                "power pool %s: the reservation of absent node %s (%.1f W) released by %s",
                keys.pool,
                node,
                record.reserved_w,
                by,
            )
            return record.reserved_w
    raise ReleaseRefusedError(f"node {node}'s grant in pool {keys.pool} kept changing; try again")


@dataclass(frozen=True)
class NodeStatus:
    node: str
    grant_w: float | None
    demand_w: float
    floor_w: float
    applied_w: float | None
    power_w: float | None
    priority_w: dict[int, float]
    reserved_w: float | None = None
    """An absent node's reservation (its report is gone, its grant kept; None: the node reports)."""
    absent_since_s: float | None = None
    """When the allocator found it absent (Unix time; None: not yet, or the node reports)."""


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
                    "reserved_w": n.reserved_w,
                    "absent_since_s": n.absent_since_s,
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
                grant.reserved_w if grant is not None and report is None else None,
                grant.absent_since_s if grant is not None and report is None else None,
            )
        )
    problem = None
    if view.request is not None:
        needs = [r.report.need(n) for n, r in sorted(view.reports.items())]
        problem = allocate(view.request.budget_w, needs, view.reserved_w).problem
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

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

from perseus_client.pool_messages import PoolNode, PoolStatusReply

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


PoolStatus = PoolStatusReply
"""A pool as of one etcd revision: the admin socket's reply as it is."""
NodeStatus = PoolNode


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
                grant.reserved_w if grant is not None and report is None else None,
                grant.absent_since_s if grant is not None and report is None else None,
            )
        )
    problem = None
    if view.request is not None:
        needs = [r.report.need(n) for n, r in sorted(view.reports.items())]
        problem = allocate(view.request.budget_w, needs, view.reserved_w).problem
    return PoolStatus(
        pool=keys.pool,
        revision=revision,
        requested_w=None if view.request is None else view.request.budget_w,
        requested_by="" if view.request is None else view.request.by,
        active_w=None if view.active is None else view.active.budget_w,
        granted_w=round(view.granted_w, 3),
        allocator=view.allocator_node,
        problem=problem,
        nodes=tuple(nodes),
        requested_age_s=None if view.request is None else round(max(0.0, now_s - view.request.at_s), 1),
        signal=None if view.request is None else view.request.freshness(now_s),
    )

"""`PoolAllocator`: every node runs one; the one holding the pool's `allocator` key moves the grants.

Election: the key is created only if absent, attached to the candidate's lease; it dies with that lease, and
the next candidate's round takes it. Every write of the allocator is a transaction that holds only if its
key still has the creation revision it won with, and if no grant was written since the revision it read (or
since its own last write): a stale allocator (its lease expired while it was cut off) cannot write, and
neither can one that read an old view. That is one comparison on the whole `grants/` range, whatever the
size of the pool; a move of more grants than etcd takes in one transaction (`MAX_OPS_PER_TXN`) is split
into several, each guarded the same way, in an order that keeps the invariant at every revision between
them (lowers before the active budget changes; raises, which only add up to what the budget allows, one
part after another).

Each round works from one read of the pool (`PoolView`) and makes at most one move:

1. Lower: grants above their new targets are lowered, grants of nodes that left are deleted, and the active
   budget is set to the requested one, in one transaction. Afterwards every grant is at most its target, so
   the sum is at most the new budget.
2. Raise, once no lower is left and every node whose grant was lowered reports it applied (or `ack_timeout_s`
   passed: a node that does not answer loses its lease soon): grants below their targets are raised.

An external budget signal that went stale moves nothing for its hold time, then deletes every grant (each
node holds its safe cap); docs/power-pool.md, "Budgets from outside".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from perseusd.cluster.etcd_store import (
    EtcdStore,
    LeaseLostError,
    compare_create,
    compare_mod,
    compare_range_mod_at_most,
    delete_op,
    put_op,
)
from perseusd.pool.alloc import Allocation, allocate, plan_moves
from perseusd.pool.keys import FRESH, LAPSED, PoolKeys, encode_grant
from perseusd.pool.view import PoolView

logger = logging.getLogger(__name__)

ACK_TOLERANCE_W = 0.05

MAX_OPS_PER_TXN = 100
"""etcd refuses a transaction of more than `--max-txn-ops` operations (128 by default): larger moves are
split into transactions of at most this many writes."""


class PoolAllocator:
    """One node's allocator role (see module). Not thread-safe: the pool agent's thread owns it."""

    def __init__(
        self,
        store: EtcdStore,
        keys: PoolKeys,
        node: str,
        ack_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store, self._keys, self._node = store, keys, node
        self._ack_timeout_s, self._clock, self._wall_clock = ack_timeout_s, clock, wall_clock
        self._freshness = FRESH
        self._waiting_since_s: float | None = None
        self._problem: str | None = None
        self.leader = False
        self.busy = False
        """Whether the next round has work soon: a move was just made, acknowledgements are awaited, or
        this node just won the election (its owner then runs the next round sooner)."""
        self.moves = 0
        self.transactions = 0
        self.wins = 0
        """How often this node won the election."""
        self.last_allocation: Allocation | None = None

    def round(self, view: PoolView, lease_id: int) -> None:
        """Campaign if nobody allocates; if this node does, make the next move (see module)."""
        allocator = view.allocator
        self.busy = False
        if allocator is None:
            won, _ = self._store.txn(
                [compare_create(self._keys.allocator, 0)],
                [put_op(self._keys.allocator, self._node, lease_id)],
            )
            if won:
                logger.info("power pool %s: this node (%s) allocates", self._keys.pool, self._node)
                self.busy = True
                self.wins += 1
            return  # the next round reads the key back and acts
        self.leader = allocator.lease_id == lease_id
        if self.leader:
            self._move(view, allocator.create_revision)

    def _move(self, view: PoolView, won_at: int) -> None:
        if view.request is None:
            self._clear(view, won_at)
            return
        if self._signal_stale(view, won_at):
            return
        needs = [r.report.need(node) for node, r in sorted(view.reports.items())]
        allocation = allocate(view.request.budget_w, needs)
        self.last_allocation = allocation
        self._report_problem(allocation)
        current = {n: g.grant_w for n, g in view.grants.items() if self._same_lease(view, n)}
        stale = [n for n in view.grants if n not in current]  # the node came back under a new lease
        moves = plan_moves(current, allocation.grants_w)
        set_active = view.active is None or view.active.budget_w != view.request.budget_w
        if moves.lowers or moves.drops or stale or set_active:
            ops = [self._put_grant(view, n, w) for n, w in moves.lowers.items()]
            ops += [delete_op(self._keys.grant(n)) for n in (*moves.drops, *stale)]
            last = [put_op(self._keys.active, view.request.encode())] if set_active else []
            self._commit("lower", won_at, ops, last, view)
            self._waiting_since_s = None
            return
        if not moves.raises:
            self._waiting_since_s = None
            return
        if self._waiting_for_acks(view):
            self.busy = True
            return
        extra = []
        if view.active_entry is not None:
            extra.append(compare_mod(self._keys.active, view.active_entry.mod_revision))
        ops = [self._put_grant(view, n, w) for n, w in moves.raises.items()]
        self._commit("raise", won_at, ops, [], view, extra)

    def _signal_stale(self, view: PoolView, won_at: int) -> bool:
        """An external budget signal that stopped: nothing moves while the grants are held; once the hold is
        over every grant is deleted (each node then holds its safe cap, never above its last grant); the
        active budget stays, so the nodes know the pool is still capped."""
        assert view.request is not None
        freshness = view.request.freshness(self._wall_clock())
        if freshness != self._freshness:
            log = logger.info if freshness == FRESH else logger.warning
            log("power pool %s: budget signal from %s: %s", self._keys.pool, view.request.by, freshness)
            self._freshness = freshness
        if freshness == FRESH:
            return False
        if freshness == LAPSED and view.grants:
            self._clear(view, won_at, budget=False)
        return True

    def _clear(self, view: PoolView, won_at: int, budget: bool = True) -> None:
        """No budget requested: every grant goes, then the active budget (with `budget`)."""
        ops = [delete_op(self._keys.grant(n)) for n in view.grants]
        last = [delete_op(self._keys.active)] if budget and view.active_entry is not None else []
        if ops or last:
            self._commit("clear", won_at, ops, last, view)

    def _waiting_for_acks(self, view: PoolView) -> bool:
        """Whether a node still runs above its (lowered) grant, for less than `ack_timeout_s` so far."""
        behind = [
            node
            for node, grant in view.grants.items()
            if node in view.reports
            and (applied_w := view.reports[node].report.applied_w) is not None
            and applied_w > grant.grant_w + ACK_TOLERANCE_W
        ]
        if not behind:
            self._waiting_since_s = None
            return False
        now_s = self._clock()
        if self._waiting_since_s is None:
            self._waiting_since_s = now_s
        if now_s - self._waiting_since_s < self._ack_timeout_s:
            return True
        logger.warning(
            "power pool %s: %s did not apply a lowered grant within %.1f s; raising the others",
            self._keys.pool,
            ", ".join(sorted(behind)),
            self._ack_timeout_s,
        )
        return False

    def _same_lease(self, view: PoolView, node: str) -> bool:
        report = view.reports.get(node)
        return report is not None and report.entry.lease_id == view.grants[node].entry.lease_id

    def _put_grant(self, view: PoolView, node: str, grant_w: float) -> dict[str, Any]:
        return put_op(self._keys.grant(node), encode_grant(grant_w), view.reports[node].entry.lease_id)

    def _commit(
        self,
        what: str,
        won_at: int,
        ops: list[dict[str, Any]],
        last: list[dict[str, Any]],
        view: PoolView,
        extra: list[dict[str, Any]] | None = None,
    ) -> bool:
        """`ops` then `last`, in transactions of at most `MAX_OPS_PER_TXN` writes (`last` in the final one),
        each guarded (see module); stops at the first that does not hold (the next round reads again)."""
        parts = [ops[i : i + MAX_OPS_PER_TXN] for i in range(0, len(ops), MAX_OPS_PER_TXN)] or [[]]
        if len(parts[-1]) + len(last) <= MAX_OPS_PER_TXN:
            parts[-1] = parts[-1] + last
        else:
            parts.append(last)
        seen = view.revision
        for part in parts:
            guard = [
                compare_create(self._keys.allocator, won_at),
                compare_range_mod_at_most(self._keys.grants, seen),
            ]
            try:
                applied, revision = self._store.txn(guard + (extra or []), part)
            except LeaseLostError:  # a node's lease expired since the read (not ours): read again
                applied, revision = False, view.revision
            if not applied:
                logger.debug(
                    "power pool %s: %s not applied (the pool changed); reading again", self._keys.pool, what
                )
                return False
            self.transactions += 1
            seen = revision
        self.moves += 1
        self.busy = True
        logger.debug("power pool %s: %s at revision %d (read %d)", self._keys.pool, what, seen, view.revision)
        return True

    def _report_problem(self, allocation: Allocation) -> None:
        problem = allocation.problem
        if problem != self._problem:
            if problem is not None:
                logger.error("power pool %s: %s", self._keys.pool, problem)
            elif self._problem is not None:
                logger.info("power pool %s: the budget covers the floors again", self._keys.pool)
            self._problem = problem

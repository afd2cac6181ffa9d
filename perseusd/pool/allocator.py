"""`PoolAllocator`: every node runs one; the one holding the pool's `allocator` key moves the grants.

Election: the key is created only if absent, attached to the candidate's lease; it dies with that lease, and
the next candidate's round takes it. Every write of the allocator is a transaction that holds only if its
key still has the creation revision it won with, and if no grant was written since the revision it read (or
since its own last write): a stale allocator (its lease expired while it was cut off) cannot write, and
neither can one that read an old view. A move of more grants than etcd takes in one transaction is split
into several, each guarded the same way, in an order that keeps the invariant at every revision between
them (`MoveWriter`, in `perseusd.pool.move_writer`).

Each round works from one read of the pool (`PoolView`) and makes at most one move:

1. Lower: grants above their new targets are lowered, and the active budget is set to the requested one,
   in one transaction. Afterwards every grant is at most its target, so the sum is at most the new budget.
   A lowered grant carries the higher one (`held_w`) until the node reports it applied the lower one.
2. Raise, once no lower is left and every node whose grant was lowered reports it applied: grants below
   their targets are raised. "Reports it applied" is by revision: the node's report names the etcd
   revision of the grant it applies, which must have reached the lowered grant's (a node reports a raise
   late, so its report's watts may be older than what it holds; a report without a revision, an older
   daemon's, is taken by its watts). A lowered grant keeps its `held_w` until its next write (no second
   round of writes to drop it): once the node's report names the grant's revision, the higher grant no
   longer counts, and the next lower of that node carries its current grant as the one it may still apply.

Absent nodes: grants are written with no lease, and each write holds only if the node's report is still the
one the allocator read. A node whose report vanished keeps its grant as a reservation (policy `hold`, the
default: the budget less what the absent nodes may draw is divided among the nodes that report), or, with
policy `release` (nodes fenced out of band), its grant is deleted at the next round (in the same transaction
as the raises that hand its share out, when nothing is to be lowered) and the others are raised after
`ack_timeout_s` even if a node did not report applying a lowered grant (`AbsentNodes`, in
`perseusd.pool.absent_nodes`).

An external budget signal that went stale moves nothing for its hold time, then deletes the grant of every
node that reports (each holds its safe cap; absent nodes' reservations stay); docs/power-pool.md, "Budgets
from outside".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from perseusd.cluster.etcd_store import EtcdStore, compare_create, compare_mod, delete_op, put_op
from perseusd.pool.absent_nodes import HOLD, AbsentNodes
from perseusd.pool.alloc import Allocation, allocate, plan_moves
from perseusd.pool.keys import FRESH, LAPSED, GrantRecord, PoolKeys
from perseusd.pool.move_writer import ETCD_MAX_TXN_OPS, MoveWriter, Op
from perseusd.pool.view import Grant, PoolView

logger = logging.getLogger(__name__)

ACK_TOLERANCE_W = 0.05


def _behind(view: PoolView, node: str, grant: Grant) -> bool:
    """Whether `node` may still apply more than its grant: it reports more, or its grant was lowered (it
    carries `held_w`) at a revision its report has not reached (a node reports a raise late, so a report's
    watts alone may be older than what it applies; a report without a revision is an older daemon's, which
    reports every grant at once)."""
    report = view.reports[node].report
    if report.applied_w is not None and report.applied_w > grant.grant_w + ACK_TOLERANCE_W:
        return True
    applied_at = report.applied_revision
    return grant.held_w is not None and applied_at is not None and applied_at < grant.entry.mod_revision


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
        absent_node: str = HOLD,
        max_txn_ops: int = ETCD_MAX_TXN_OPS,
        make_store: Callable[[], EtcdStore] | None = None,
    ) -> None:
        """`make_store`: a new store on the same etcd, one per connection the parts of a move sent at once
        take (`PartSender`); None: every part after the one before."""
        self._absent_nodes = AbsentNodes(keys, absent_node, wall_clock)
        self._writer = MoveWriter(store, keys, max_txn_ops, make_store)
        self._ack_warned = False
        self._store, self._keys, self._node = store, keys, node
        self._ack_timeout_s, self._clock, self._wall_clock = ack_timeout_s, clock, wall_clock
        self._freshness = FRESH
        self._waiting_since_s: float | None = None
        self._problem: str | None = None
        self.leader = False
        self.busy = False
        """Whether the next round has work soon: a move was just made, acknowledgements are awaited, or
        this node just won the election (its owner then runs the next round sooner)."""
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
            moves = self._writer.moves
            self._move(view, allocator.create_revision)
            self.busy = self.busy or self._writer.moves > moves  # a move was made

    def _move(self, view: PoolView, won_at: int) -> None:
        absent_nodes = self._absent_nodes
        absent_nodes.remember_acks(view)
        if view.request is None:
            self._clear(view, won_at)
            return
        absent = absent_nodes.find(view)
        if self._signal_stale(view, won_at):
            return
        needs = [r.report.need(node) for node, r in sorted(view.reports.items())]
        release = absent_nodes.release
        reserved_w = 0.0 if release else sum(absent_nodes.reserved_w(n, g) for n, g in absent.items())
        allocation = allocate(view.request.budget_w, needs, reserved_w)
        self.last_allocation = allocation
        self._report_problem(allocation)
        current = {n: g.grant_w for n, g in view.grants.items() if n in view.reports}
        moves = plan_moves(current, allocation.grants_w)
        set_active = view.active is None or view.active.budget_w != view.request.budget_w
        released = sorted(absent) if release else []
        marks = [] if release else sorted(n for n, g in absent.items() if g.absent_since_s is None)
        drops = [absent_nodes.drop(n) for n in released]
        if moves.lowers or marks:
            ops = [self._lower(view, n, w) for n, w in moves.lowers.items()]
            ops += drops
            ops += [absent_nodes.mark(view, n) for n in marks]
            last = [put_op(self._keys.active, view.request.encode())] if set_active else []
            self._writer.write("lower", won_at, ops, last, view.revision, any_order=True)  # each only lowers
            self._waiting_since_s = None
            return
        # A node that returned loses its absence mark. A lowered grant's `held_w` is not rewritten away once
        # the node reports it (a thousand writes after every lowering): the report's revision says the node
        # is no longer behind, and the grant's next write drops it (`_lower`, the raises). This node's own
        # grant is the exception: its report vanishes with its role, so no later allocator could know.
        settles = [
            n
            for n, g in view.grants.items()
            if n in view.reports
            and n not in moves.raises
            and (g.absent_since_s is not None or (n == self._node and g.held_w is not None))
        ]
        if not moves.raises and not settles and not drops and not set_active:
            self._waiting_since_s = None
            return
        active = [put_op(self._keys.active, view.request.encode())] if set_active else []
        if self._waiting_for_acks(view):
            if drops or active:
                self._writer.write("lower", won_at, drops, active, view.revision)
            self.busy = self.busy or bool(moves.raises)  # settles alone wait at the rounds' own pace
            return
        extra = []
        if view.active_entry is not None:
            extra.append(compare_mod(self._keys.active, view.active_entry.mod_revision))
        # Released grants first: the raises that hand out their share come in the same or a later part.
        ops = drops + [self._put_grant(view, n, GrantRecord(w)) for n, w in moves.raises.items()]
        ops += [self._put_grant(view, n, GrantRecord(view.grants[n].grant_w)) for n in sorted(settles)]
        # Nothing to lower: every grant is at most its target, so the active budget can change in the first
        # part, with the raises (the sum stays within the new budget at every revision).
        what = "raise" if moves.raises else "settle" if settles else "release" if drops else "budget"
        # Raises (and settles) in any order once the budget allows them all, after the released grants.
        self._writer.write(
            what, won_at, ops, [], view.revision, extra, active, any_order=True, before=len(drops)
        )

    def _signal_stale(self, view: PoolView, won_at: int) -> bool:
        """An external budget signal that stopped: nothing moves while the grants are held; once the hold is
        over the grants of the nodes that report are deleted (each then holds its safe cap, never above its
        last grant); the active budget stays, so the nodes know the pool is still capped."""
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
        """No budget requested: every grant goes, then the active budget (with `budget`). An absent node's
        grant stays (its GPUs may still draw it; with policy "release" it goes too)."""
        absent_nodes = self._absent_nodes
        absent = absent_nodes.find(view)
        ops = [
            (
                delete_op(self._keys.grant(n)),
                compare_create(self._keys.node(n), view.reports[n].entry.create_revision),
            )
            for n in view.grants
            if n in view.reports
        ]
        ops += [absent_nodes.drop(n) for n in (sorted(absent) if absent_nodes.release else [])]
        last = [delete_op(self._keys.active)] if budget and view.active_entry is not None else []
        if ops or last:
            self._writer.write("clear", won_at, ops, last, view.revision)

    def _waiting_for_acks(self, view: PoolView) -> bool:
        """Whether a node still runs above its (lowered) grant, for less than `ack_timeout_s` so far."""
        behind = [
            node for node, grant in view.grants.items() if node in view.reports and _behind(view, node, grant)
        ]
        if not behind:
            self._waiting_since_s, self._ack_warned = None, False
            return False
        now_s = self._clock()
        if self._waiting_since_s is None:
            self._waiting_since_s = now_s
        if now_s - self._waiting_since_s < self._ack_timeout_s:
            return True
        if not self._absent_nodes.release:
            # Its share waits until it applies the lower grant or is gone (then reserved).
            if not self._ack_warned:
                logger.warning(
                    "power pool %s: %s did not apply a lowered grant within %.1f s; the others are raised "
                    "once it does, or once it is absent (its higher grant then stays reserved)",
                    self._keys.pool,
                    ", ".join(sorted(behind)),
                    self._ack_timeout_s,
                )
                self._ack_warned = True
            return True
        logger.warning(
            "power pool %s: %s did not apply a lowered grant within %.1f s; raising the others",
            self._keys.pool,
            ", ".join(sorted(behind)),
            self._ack_timeout_s,
        )
        return False

    def _put_grant(self, view: PoolView, node: str, record: GrantRecord) -> Op:
        """A grant for a node that reports: written only if its report is still the one read (a node that
        left or came back since is read again first). No lease: the grant outlives the node's report."""
        created = view.reports[node].entry.create_revision
        return put_op(self._keys.grant(node), record.encode()), compare_create(self._keys.node(node), created)

    def _lower(self, view: PoolView, node: str, grant_w: float) -> Op:
        """A lowered grant, carrying the higher one the node may apply until it reports the lower one: its
        current grant, or, while it has not reported applying that one (lowered too), the one it held."""
        grant = view.grants[node]
        held_w = max(grant.grant_w, grant.held_w or 0.0) if _behind(view, node, grant) else grant.grant_w
        return self._put_grant(view, node, GrantRecord(grant_w, held_w))

    def close(self) -> None:
        """Close the connections of the parts sent at once."""
        self._writer.close()

    def _report_problem(self, allocation: Allocation) -> None:
        problem = allocation.problem
        if problem != self._problem:
            if problem is not None:
                logger.error("power pool %s: %s", self._keys.pool, problem)
            elif self._problem is not None:
                logger.info("power pool %s: the budget covers the floors again", self._keys.pool)
            self._problem = problem

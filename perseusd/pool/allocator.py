"""`PoolAllocator`: every node runs one; the one holding the pool's `allocator` key moves the grants.

Election: the key is created only if absent, attached to the candidate's lease; it dies with that lease, and
the next candidate's round takes it. Every write of the allocator is a transaction that holds only if its
key still has the creation revision it won with, and if no grant was written since the revision it read (or
since its own last write): a stale allocator (its lease expired while it was cut off) cannot write, and
neither can one that read an old view. That is one comparison on the whole `grants/` range, whatever the
size of the pool; a move of more grants than etcd takes in one transaction (`--max-txn-ops`, 128 by
default: `ETCD_MAX_TXN_OPS`) is split into several, each as large as etcd takes and guarded the same way,
in an order that keeps the invariant at every revision between them (lowers before the active budget
changes; raises, which only add up to what the budget allows, one part after another).

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
one the allocator read (an absent node's grant, marked absent, only if the grant is still the one read). A
node whose report vanished (its lease expired: dead, frozen, cut off from etcd) keeps its grant as a
reservation (policy `hold`, the default): the budget less what the absent nodes may draw
(`GrantRecord.reserved_w`) is divided among the nodes that report, the allocator never deletes an absent
node's grant, and logs it once. The reservation ends when the node reports again (its grant is then
its current one, moved like any other) or when an admin releases it (`perseusd.pool.admin.release_node`).
Policy `release` (nodes fenced out of band) deletes an absent node's grant at the next round (in the same
transaction as the raises that hand its share out, when nothing is to be lowered), and raises the others
after `ack_timeout_s` even if a node did not report applying a lowered grant.

An external budget signal that went stale moves nothing for its hold time, then deletes the grant of every
node that reports (each holds its safe cap; absent nodes' reservations stay); docs/power-pool.md, "Budgets
from outside".
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
    compare_span_mod_at_most,
    delete_op,
    op_key,
    put_op,
)
from perseusd.pool.alloc import Allocation, allocate, plan_moves
from perseusd.pool.keys import FRESH, LAPSED, GrantRecord, PoolKeys
from perseusd.pool.parts import PartSender
from perseusd.pool.view import Grant, PoolView

logger = logging.getLogger(__name__)

Op = tuple[dict[str, Any], dict[str, Any]]
"""A write and the comparison it holds on (the node's report as read)."""

ACK_TOLERANCE_W = 0.05

ETCD_MAX_TXN_OPS = 128
"""etcd's default `--max-txn-ops`: it refuses a transaction with more comparisons, or more operations in a
branch, than this. A move is split into transactions of as many grants as fit (each grant a write and its
comparison, beside the guards and the active budget's write; `txn_parts`)."""

MIN_TXN_OPS, MAX_TXN_OPS = 8, 4096
"""The `--max-txn-ops` the allocator works with: each transaction holds at least one grant, and stays far
below etcd's request size limit (1.5 MiB by default; a grant's write and comparison are ~0.2 KiB)."""

GUARDS_PER_TXN = 2
"""The comparisons every allocator transaction holds on: its key's creation revision and the grants' range."""

HOLD, RELEASE = "hold", "release"
ABSENT_NODE_POLICIES = (HOLD, RELEASE)
"""What the allocator does with an absent node's grant: keep it reserved until the node returns or an admin
releases it (`hold`), or hand it to the others (`release`: for nodes fenced out of band)."""


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


def txn_parts(
    grants: int, max_ops: int, compares: tuple[int, int], first_writes: int, last_writes: int
) -> list[int]:
    """How many of `grants` writes (each with its comparison) go into each transaction of a move, in order,
    so that no transaction has more than `max_ops` comparisons or writes (etcd's `--max-txn-ops`):
    `compares` is the guards' count in the first transaction and in the later ones, `first_writes` the writes
    the first one carries beside the grants, `last_writes` those of the final one. As few transactions as
    that allows; at least one (a move of no grants may still write the active budget)."""
    sizes: list[int] = []
    left = grants
    while True:
        fixed_compares = compares[0] if not sizes else compares[1]
        fixed_writes = first_writes if not sizes else 0
        if left + max(fixed_compares, fixed_writes + last_writes) <= max_ops:
            return [*sizes, left]  # the rest, with the final writes
        room = max_ops - max(fixed_compares, fixed_writes)
        if room < 1:
            raise ValueError(f"a transaction of at most {max_ops} operations holds no grant")
        take = min(left, room)
        if take == left:  # all fit, but not with the final writes: those go with the last grant
            take -= 1
        sizes.append(take)
        left -= take


def send_order(parts: int, first: bool, last: bool, at_once: bool) -> list[list[int]]:
    """Which of a move's `parts` go to etcd together, in order: one after another; or, `at_once`, the part
    writing the active budget alone, first (`first`: a raise) or last (`last`: a lower), and the rest
    together (each part's invariant holds in any order between those)."""
    if not at_once or parts - first - last < 2:
        return [[i] for i in range(parts)]
    middle = list(range(int(first), parts - int(last)))
    return [[0]] * first + [middle] + [[parts - 1]] * last


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
        if absent_node not in ABSENT_NODE_POLICIES:
            raise ValueError(f"absent node policy must be one of {', '.join(ABSENT_NODE_POLICIES)}")
        if not MIN_TXN_OPS <= max_txn_ops <= MAX_TXN_OPS:
            raise ValueError(
                f"etcd's max operations per transaction must be in [{MIN_TXN_OPS}, {MAX_TXN_OPS}]"
            )
        self._max_txn_ops = max_txn_ops
        self._sender = None if make_store is None else PartSender(make_store)
        self._release = absent_node == RELEASE
        self._absent_logged: set[str] = set()
        self._acked_at: dict[str, int] = {}
        """Per node, the grant revision its last report seen named as applied (`_remember_acks`)."""
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
        self.moves = 0
        self.transactions = 0
        self.sent_at_once = 0
        """Transactions sent together with others of their move (`send_order`)."""
        self.largest_txn_ops = 0
        """The most comparisons or writes one of this node's allocator transactions carried."""
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
        self._remember_acks(view)
        if view.request is None:
            self._clear(view, won_at)
            return
        absent = self._absent(view)
        if self._signal_stale(view, won_at):
            return
        needs = [r.report.need(node) for node, r in sorted(view.reports.items())]
        reserved_w = 0.0 if self._release else sum(self._reserved_w(n, g) for n, g in absent.items())
        allocation = allocate(view.request.budget_w, needs, reserved_w)
        self.last_allocation = allocation
        self._report_problem(allocation)
        current = {n: g.grant_w for n, g in view.grants.items() if n in view.reports}
        moves = plan_moves(current, allocation.grants_w)
        set_active = view.active is None or view.active.budget_w != view.request.budget_w
        released = sorted(absent) if self._release else []
        marks = [] if self._release else sorted(n for n, g in absent.items() if g.absent_since_s is None)
        drops = [self._drop_absent(n) for n in released]
        if moves.lowers or marks:
            ops = [self._lower(view, n, w) for n, w in moves.lowers.items()]
            ops += drops
            ops += [self._mark_absent(view, n) for n in marks]
            last = [put_op(self._keys.active, view.request.encode())] if set_active else []
            self._commit("lower", won_at, ops, last, view, any_order=True)  # each only lowers
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
                self._commit("lower", won_at, drops, active, view)
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
        self._commit(what, won_at, ops, [], view, extra, active, any_order=True, before=len(drops))

    def _absent(self, view: PoolView) -> dict[str, Grant]:
        """The grants of nodes whose report is gone, each logged once (see module)."""
        absent = view.absent
        for node in [n for n in self._absent_logged if n not in absent]:
            self._absent_logged.discard(node)
            if node in view.reports:
                logger.info("power pool %s: node %s is back; it holds its grant again", self._keys.pool, node)
        for node, grant in sorted(absent.items()):
            if node in self._absent_logged:
                continue
            self._absent_logged.add(node)
            since_s = grant.absent_since_s if grant.absent_since_s is not None else self._wall_clock()
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since_s))
            if self._release:
                logger.warning(
                    "power pool %s: node %s is absent since %s; its grant of %.1f W is released "
                    '(power_pool_absent_node = "release": its GPUs must be fenced out of band)',
                    self._keys.pool,
                    node,
                    since,
                    grant.grant_w,
                )
            else:
                logger.warning(
                    "power pool %s: node %s is absent since %s; its grant of %.1f W stays reserved (its GPUs "
                    "may still draw it) until it returns or an admin runs "
                    "`perseusctl cap-pool release --pool %s %s`",
                    self._keys.pool,
                    node,
                    since,
                    self._reserved_w(node, grant),
                    self._keys.pool,
                    node,
                )
        return absent

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
        absent = self._absent(view)
        ops = [
            (
                delete_op(self._keys.grant(n)),
                compare_create(self._keys.node(n), view.reports[n].entry.create_revision),
            )
            for n in view.grants
            if n in view.reports
        ]
        ops += [self._drop_absent(n) for n in (sorted(absent) if self._release else [])]
        last = [delete_op(self._keys.active)] if budget and view.active_entry is not None else []
        if ops or last:
            self._commit("clear", won_at, ops, last, view)

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
        if not self._release:  # its share waits until it applies the lower grant or is gone (then reserved)
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

    def _remember_acks(self, view: PoolView) -> None:
        """The revision of the grant each node last reported applying, kept after its report is gone: a node
        that applied its lowered grant and then vanished is held to that grant, not to the higher one the
        grant still names (`held_w` stays until the grant's next write)."""
        for node, report in view.reports.items():
            if report.report.applied_revision is not None:
                self._acked_at[node] = report.report.applied_revision
        for node in [n for n in self._acked_at if n not in view.reports and n not in view.grants]:
            del self._acked_at[node]

    def _applied(self, node: str, grant: Grant) -> bool:
        """Whether `node` was seen reporting `grant` (or a later one) applied."""
        return self._acked_at.get(node, 0) >= grant.entry.mod_revision

    def _reserved_w(self, node: str, grant: Grant) -> float:
        """What an absent node's GPUs may draw: its grant, or the higher one it may not have left."""
        return grant.grant_w if self._applied(node, grant) else grant.reserved_w

    def _mark_absent(self, view: PoolView, node: str) -> Op:
        """An absent node's grant, unchanged, with the time it was found absent (for status and logs):
        written only over the grant as read, so a grant an admin released since is never written back. The
        higher grant it carries goes if the node was seen applying this one."""
        grant = view.grants[node]
        held_w = None if self._applied(node, grant) else grant.held_w
        record = GrantRecord(grant.grant_w, held_w, round(self._wall_clock(), 1))
        key = self._keys.grant(node)
        return put_op(key, record.encode()), compare_mod(key, grant.entry.mod_revision)

    def _drop_absent(self, node: str) -> Op:
        """Policy "release": an absent node's grant deleted, only while its report is still gone."""
        return delete_op(self._keys.grant(node)), compare_create(self._keys.node(node), 0)

    def _commit(
        self,
        what: str,
        won_at: int,
        ops: list[Op],
        last: list[dict[str, Any]],
        view: PoolView,
        extra: list[dict[str, Any]] | None = None,
        first: list[dict[str, Any]] | None = None,
        any_order: bool = False,
        before: int = 0,
    ) -> bool:
        """`first`, `ops` (each a write and the comparison it holds on) then `last`, in as few transactions
        as etcd takes (`txn_parts`; `first` in the first one, `last` in the final one), each guarded (see
        module); stops at the first that does not hold (the next round reads again). `first` writes the
        active budget: the later parts' guard on it is then the revision of the first. With `any_order`
        (the caller's word that `ops` keep the invariant in any order, but for their first `before`, which
        must land before the others) and a `PartSender`, the parts between the first and the last go to
        etcd at once (`send_order`)."""
        first_extra = len(extra or [])
        later_extra = 1 if first else first_extra
        head = bool(first) or before > 0
        at_once = (
            any_order
            and self._sender is not None
            and before + len(first or []) + GUARDS_PER_TXN + first_extra <= self._max_txn_ops
        )
        if at_once:
            parts = self._parts_at_once(ops, before, head, bool(last), GUARDS_PER_TXN + later_extra)
        else:
            sizes = txn_parts(
                len(ops),
                self._max_txn_ops,
                (GUARDS_PER_TXN + first_extra, GUARDS_PER_TXN + later_extra),
                len(first or []),
                len(last),
            )
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            parts = [ops[start : start + size] for start, size in zip(starts, sizes, strict=True)]
        seen = view.revision
        for batch in send_order(len(parts), head, bool(last), at_once):
            txns = []
            for index in batch:
                writes = [op for op, _ in parts[index]]
                if index == 0 and first:
                    writes = first + writes
                if index == len(parts) - 1:
                    writes += last
                compares = [
                    compare_create(self._keys.allocator, won_at),
                    self._span_guard(writes, seen) if len(batch) > 1 else self._range_guard(seen),
                    *(compare for _, compare in parts[index]),
                    *(extra or []),
                ]
                self.largest_txn_ops = max(self.largest_txn_ops, len(compares), len(writes))
                txns.append((compares, writes))
            results = self._send(txns)
            self.transactions += sum(1 for applied, _ in results if applied)
            self.sent_at_once += len(txns) if len(txns) > 1 else 0
            if not all(applied for applied, _ in results):
                logger.debug(
                    "power pool %s: %s not applied (the pool changed); reading again", self._keys.pool, what
                )
                return False
            seen = max(revision for _, revision in results)
            if batch[0] == 0 and first:
                extra = [compare_mod(self._keys.active, seen)]
        self.moves += 1
        self.busy = True
        logger.debug("power pool %s: %s at revision %d (read %d)", self._keys.pool, what, seen, view.revision)
        return True

    def _parts_at_once(
        self, ops: list[Op], before: int, head: bool, tail: bool, compares: int
    ) -> list[list[Op]]:
        """The parts of a move sent at once (`send_order`): the part sent alone first holds the active
        budget's raise and what must land before the rest (`before`), and no more; the one sent alone last
        only the active budget's lowering: every grant goes in the parts sent together, sorted by key (each
        part's keys a span of its own), as many to a part as etcd takes beside `compares` guards."""
        rest = sorted(ops[before:], key=lambda op: op_key(op[0]))
        room = self._max_txn_ops - compares
        middle = [rest[i : i + room] for i in range(0, len(rest), room)]
        return [ops[:before]] * head + middle + [[]] * tail

    def _range_guard(self, seen: int) -> dict[str, Any]:
        """No grant written since `seen` (the read, or this move's previous part)."""
        return compare_range_mod_at_most(self._keys.grants, seen)

    def _span_guard(self, writes: list[dict[str, Any]], seen: int) -> dict[str, Any]:
        """No grant written since `seen` between the first and the last key this part writes (the parts
        sent together each have a span of their own: none sees the others' writes)."""
        keys = sorted(op_key(w) for w in writes if op_key(w).startswith(self._keys.grants))
        if not keys:
            return self._range_guard(seen)
        return compare_span_mod_at_most(keys[0], keys[-1] + "\x00", seen)

    def _send(self, txns: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]) -> list[tuple[bool, int]]:
        if len(txns) > 1 and self._sender is not None:
            return self._sender.send(txns)
        results = []
        for compares, writes in txns:
            try:
                results.append(self._store.txn(compares, writes))
            except LeaseLostError:  # a node's lease expired since the read (not ours): read again
                results.append((False, 0))
        return results

    def close(self) -> None:
        """Close the connections of the parts sent at once."""
        if self._sender is not None:
            self._sender.close()

    def _report_problem(self, allocation: Allocation) -> None:
        problem = allocation.problem
        if problem != self._problem:
            if problem is not None:
                logger.error("power pool %s: %s", self._keys.pool, problem)
            elif self._problem is not None:
                logger.info("power pool %s: the budget covers the floors again", self._keys.pool)
            self._problem = problem

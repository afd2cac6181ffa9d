"""`MoveWriter`: an allocator's move written to etcd, in guarded transactions as large as etcd takes.

Every transaction of a move holds only if the allocator key still has the creation revision the allocator
won it with, and if no grant was written since the revision it read (or since the move's previous part): a
stale allocator (its lease expired while it was cut off) cannot write, and neither can one that read an old
view. That is one comparison on the whole `grants/` range, whatever the size of the pool; a move of more
grants than etcd takes in one transaction (`--max-txn-ops`, 128 by default: `ETCD_MAX_TXN_OPS`) is split
into several, each as large as etcd takes and guarded the same way (`txn_parts`), in the order the allocator
gives (`perseusd.pool.allocator`: lowers before the active budget changes; raises, which only add up to what
the budget allows, after it). Parts that keep the invariant in any order go to etcd at once when a
`PartSender` is given (`send_order`), each guarded on the span of grant keys it writes rather than on the
whole range (none sees the others' writes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from perseusd.cluster.etcd_store import (
    EtcdStore,
    LeaseLostError,
    compare_create,
    compare_mod,
    compare_range_mod_at_most,
    compare_span_mod_at_most,
    op_key,
)
from perseusd.pool.keys import PoolKeys
from perseusd.pool.parts import PartSender, Txn

logger = logging.getLogger(__name__)

Op = tuple[dict[str, Any], dict[str, Any]]
"""A write and the comparison it holds on (the node's report as read)."""

ETCD_MAX_TXN_OPS = 128
"""etcd's default `--max-txn-ops`: it refuses a transaction with more comparisons, or more operations in a
branch, than this. A move is split into transactions of as many grants as fit (each grant a write and its
comparison, beside the guards and the active budget's write; `txn_parts`)."""

MIN_TXN_OPS, MAX_TXN_OPS = 8, 4096
"""The `--max-txn-ops` the allocator works with: each transaction holds at least one grant, and stays far
below etcd's request size limit (1.5 MiB by default; a grant's write and comparison are ~0.2 KiB)."""

GUARDS_PER_TXN = 2
"""The comparisons every allocator transaction holds on: its key's creation revision and the grants' range."""


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


class MoveWriter:
    """Writes one node's allocator moves (see module). Not thread-safe: the pool agent's thread owns it."""

    def __init__(
        self,
        store: EtcdStore,
        keys: PoolKeys,
        max_txn_ops: int = ETCD_MAX_TXN_OPS,
        make_store: Callable[[], EtcdStore] | None = None,
    ) -> None:
        """`make_store`: a new store on the same etcd, one per connection the parts of a move sent at once
        take (`PartSender`); None: every part after the one before."""
        if not MIN_TXN_OPS <= max_txn_ops <= MAX_TXN_OPS:
            raise ValueError(
                f"etcd's max operations per transaction must be in [{MIN_TXN_OPS}, {MAX_TXN_OPS}]"
            )
        self._store, self._keys = store, keys
        self._max_txn_ops = max_txn_ops
        self._sender = None if make_store is None else PartSender(make_store)
        self.moves = 0
        """Moves written whole (every part held)."""
        self.transactions = 0
        self.sent_at_once = 0
        """Transactions sent together with others of their move (`send_order`)."""
        self.largest_txn_ops = 0
        """The most comparisons or writes one of this node's allocator transactions carried."""

    def write(
        self,
        what: str,
        won_at: int,
        ops: list[Op],
        last: list[dict[str, Any]],
        read_at: int,
        extra: list[dict[str, Any]] | None = None,
        first: list[dict[str, Any]] | None = None,
        any_order: bool = False,
        before: int = 0,
    ) -> bool:
        """`first`, `ops` (each a write and the comparison it holds on) then `last`, in as few transactions
        as etcd takes (`txn_parts`; `first` in the first one, `last` in the final one), each guarded (see
        module) on the allocator key's creation revision `won_at` and on no grant written since `read_at`
        (the pool's read); stops at the first that does not hold (the next round reads again). `first`
        writes the active budget: the later parts' guard on it is then the revision of the first. With
        `any_order` (the caller's word that `ops` keep the invariant in any order, but for their first
        `before`, which must land before the others) and a `PartSender`, the parts between the first and the
        last go to etcd at once (`send_order`). `extra`: more comparisons, in every part. `what` names the
        move in the log. Whether every part held."""
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
            compares = (GUARDS_PER_TXN + first_extra, GUARDS_PER_TXN + later_extra)
            parts = self._parts_in_order(ops, compares, len(first or []), len(last))
        seen = read_at
        for batch in send_order(len(parts), head, bool(last), at_once):
            txns = [
                self._txn(parts, index, len(batch) > 1, won_at, seen, first, last, extra) for index in batch
            ]
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
        logger.debug("power pool %s: %s at revision %d (read %d)", self._keys.pool, what, seen, read_at)
        return True

    def _txn(
        self,
        parts: list[list[Op]],
        index: int,
        spans: bool,
        won_at: int,
        seen: int,
        first: list[dict[str, Any]] | None,
        last: list[dict[str, Any]],
        extra: list[dict[str, Any]] | None,
    ) -> Txn:
        """Part `index`'s comparisons and writes (`first` before the first part's, `last` after the final
        one's); its grants guarded on the span of keys it writes when it is sent with others (`spans`), else
        on the whole range."""
        writes = [op for op, _ in parts[index]]
        if index == 0 and first:
            writes = first + writes
        if index == len(parts) - 1:
            writes += last
        compares = [
            compare_create(self._keys.allocator, won_at),
            self._span_guard(writes, seen) if spans else self._range_guard(seen),
            *(compare for _, compare in parts[index]),
            *(extra or []),
        ]
        self.largest_txn_ops = max(self.largest_txn_ops, len(compares), len(writes))
        return compares, writes

    def _parts_in_order(
        self, ops: list[Op], compares: tuple[int, int], first_writes: int, last_writes: int
    ) -> list[list[Op]]:
        """The parts of a move sent one after another, each as full as etcd takes (`txn_parts`)."""
        sizes = txn_parts(len(ops), self._max_txn_ops, compares, first_writes, last_writes)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [ops[start : start + size] for start, size in zip(starts, sizes, strict=True)]

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

    def _send(self, txns: list[Txn]) -> list[tuple[bool, int]]:
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

"""`PoolAgent`: a node's part in a power pool, on a thread of its own (only when a pool is configured).

Every round (`refresh_interval_s`): keep this node's lease alive (every third of the TTL), publish its report
(demand, floor, priority mix, safe cap, the grant it applies, measured power) when it changed, read the pool,
apply this node's grant through its `NodePowerTarget` (and publish at once that it applies it, with the
grant's etcd revision, when the grant was lowered: the allocator waits for that before it raises anyone; a
raised grant is reported with the next publication, at the latest the next read, so that a raise costs no etcd
write on the pool's critical path), and take its turn as allocator (`PoolAllocator`; while it allocates,
the node also watches the requested budget and the reports' deletions, so that a new budget or a node's
lease expiring is acted on at once).

What a round reads is sized for pools of a thousand nodes on one etcd: a node reads only its own grant, the
budget and the allocator key (one small request), and only when one of its two watches (`PoolWatches`: its
grant; the allocator key and the budget, deletions only) says they changed, or every half TTL (so a watch that
hangs costs latency, never correctness). Only the allocator, and a node that
finds no allocator, reads the whole pool, every round. The measured power in the report is published only
when it moved enough or is old (`NodeMembership`), not at every measurement. A new grant is applied from the
watch event itself, without a read; a node that finds no allocator campaigns on its small read, and only the
winner reads the pool (a thousand nodes reading the whole pool when the allocator dies would take etcd
seconds).

What is applied (no budget: nothing; this node's grant; the safe cap; the last grant while etcd is
unreachable) is `GrantHolder`'s. The lease, the report under it and leaving the pool are `NodeMembership`'s: a
clean stop deletes the node's report and grant in one transaction (its share goes back to the pool at once),
then revokes its lease.

Nothing here blocks the daemon: the target is called from this thread, which is why targets must be safe to
call from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perseus_client.status_messages import PoolInfo

from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.etcd_store import ClusterError, EtcdStore, LeaseLostError, prefix_end, put_op
from perseusd.pool.absent_nodes import ABSENT_NODE_POLICIES, HOLD
from perseusd.pool.allocator import PoolAllocator
from perseusd.pool.feed import BudgetFile, FeedSettings
from perseusd.pool.grant_holder import UNCAPPED, AgentStatus, GrantHolder
from perseusd.pool.keys import PoolKeys, check_pool
from perseusd.pool.membership import NodeMembership, NodeNameTakenError
from perseusd.pool.move_writer import ETCD_MAX_TXN_OPS, MAX_TXN_OPS, MIN_TXN_OPS
from perseusd.pool.view import Decoded, read_pool
from perseusd.pool.watches import PoolWatches
from perseusd.power.target import NodePowerTarget
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

BUSY_ROUNDS_PER_INTERVAL = 5
"""An allocator that just moved grants, or awaits their acknowledgements, reads again this much sooner."""


@dataclass(frozen=True)
class PoolSettings:
    """Which pool this node joins and where it falls back to (W; 0 = its floor)."""

    pool: str
    safe_cap_w: float = 0.0
    budget_file: str = ""
    """A file a facility controller writes the pool's budget to ("" = none; `perseusd.pool.feed`)."""
    budget_max_age_s: float = 120.0
    budget_hold_s: float = 300.0
    absent_node: str = HOLD
    """What this node does with an absent node's grant while it allocates: "hold" or "release"."""
    etcd_max_txn_ops: int = ETCD_MAX_TXN_OPS
    """The etcd cluster's `--max-txn-ops`: the most comparisons or writes of one allocator transaction."""

    def __post_init__(self) -> None:
        check_pool(self.pool)
        if not MIN_TXN_OPS <= self.etcd_max_txn_ops <= MAX_TXN_OPS:
            raise ValueError(
                f"etcd's max operations per transaction must be in [{MIN_TXN_OPS}, {MAX_TXN_OPS}]"
            )
        if self.absent_node not in ABSENT_NODE_POLICIES:
            raise ValueError(
                "power pool absent node policy must be one of " + ", ".join(ABSENT_NODE_POLICIES)
            )
        if self.budget_file:
            FeedSettings(Path(self.budget_file), self.budget_max_age_s, self.budget_hold_s)
        if not 0 <= self.safe_cap_w < 1e7:
            raise ValueError("power pool safe cap must be 0 (the floor) .. 10 MW")


class PoolAgent:
    """A node's pool membership and allocator role (see module)."""

    def __init__(
        self,
        cluster: ClusterConfig,
        settings: PoolSettings,
        target: NodePowerTarget,
        measure_w: Callable[[], float | None] = lambda: None,
        store: EtcdStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
        wall_clock: Callable[[], float] = time.time,
        part_store: Callable[[], EtcdStore] | None = None,
    ) -> None:
        """`watch=False`: no watches; every round reads (for a store that is not a real etcd), and the
        allocator sends a move's parts one after another. `part_store`: a new store for each connection that
        sends parts of a move at once (default: an `EtcdStore` on the cluster's endpoints)."""
        self._cluster, self._settings, self._clock = cluster, settings, clock
        self._store = store or EtcdStore(cluster.parsed_endpoints, cluster.timeout_s)
        self._keys = PoolKeys(cluster.prefix, settings.pool)
        self._node = cluster.node_name
        self._allocator = PoolAllocator(
            self._store,
            self._keys,
            self._node,
            cluster.lease_ttl_s,
            clock,
            wall_clock,
            settings.absent_node,
            settings.etcd_max_txn_ops,
            (part_store or (lambda: EtcdStore(cluster.parsed_endpoints, cluster.timeout_s)))
            if watch
            else None,
        )
        self._membership = NodeMembership(
            self._store, self._keys, cluster, settings.pool, settings.safe_cap_w, target, measure_w, clock
        )
        self._holder = GrantHolder(
            settings.pool, self._node, target, settings.safe_cap_w, cluster.lease_ttl_s, clock, wall_clock
        )
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._feed = None
        if settings.budget_file:
            feed = FeedSettings(Path(settings.budget_file), settings.budget_max_age_s, settings.budget_hold_s)
            self._feed = BudgetFile(feed)
        self._fed: str | None = None
        self._feed_error: str | None = None
        self._wake = threading.Event()
        self._watches = PoolWatches(cluster, self._keys, self._wake, watch)
        self._read_at_s: float | None = None
        self.reads = self.full_reads = 0
        self._decoded: Decoded = {}
        """The reports and grants of the last full read, decoded (`read_pool`)."""
        self.allocator_cpu_s: list[float] = []
        """CPU time of this node's last allocator rounds (the full read, decoding, allocation, writes)."""

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._watches.start()
        self._thread = NamedThread(target=self._run, name="perseusd-power-pool", daemon=True)
        self._thread.start()

    def stop(self, revoke: bool = True, uncap: bool = True) -> None:
        """Stop; with `revoke`, drop out of the pool at once; with `uncap`, lift this node's cap."""
        self._stopping.set()
        self._wake.set()
        self._watches.stop()
        if self._thread is not None:
            self._thread.join(timeout=2 * self._store.attempts * self._cluster.timeout_s + 1.0)
        if self._thread is not None and self._thread.is_alive():
            # Stuck on etcd: the store is the thread's; the lease expires by itself.
            logger.warning("power pool: the agent did not stop in time; its lease will expire")
        else:
            if revoke:
                self._membership.leave()
            self._allocator.close()
            self._store.close()
        if uncap:
            self._holder.apply(None, UNCAPPED)

    def status(self) -> AgentStatus:
        return self._holder.status(self._allocator.leader)

    def info(self, target: str) -> PoolInfo:
        """This node's pool as `perseusctl status` shows it; `target` is how the grant is held."""
        status = self.status()
        return PoolInfo(
            status.pool,
            self._node,
            target,
            status.budget_w,
            status.grant_w,
            status.applied_w,
            status.reason,
            status.allocator,
            status.last_error,
            status.budget_by,
            status.budget_age_s,
            status.budget_signal,
        )

    def _run(self) -> None:
        try:
            self._rounds()
        finally:
            self._watches.stop_leader_watches()

    def _rounds(self) -> None:
        interval_s = self._cluster.refresh_interval_s
        while not self._stopping.is_set():
            self._wake.clear()
            pushed, must_read = self._watches.take_pushed()
            self._round(must_read or self._read_due(), pushed)
            self._watches.follow_leadership(self._allocator.leader)
            busy = self._allocator.busy
            self._wake.wait(interval_s / BUSY_ROUNDS_PER_INTERVAL if busy else interval_s)

    def _read_due(self) -> bool:
        """Whether this round reads etcd without being woken: always without watches, as the allocator, and
        every half TTL (so a node whose watch hung applies a lowered grant before the allocator stops
        waiting for it, one TTL)."""
        last_s = self._read_at_s
        return (
            not self._watches.enabled
            or self._allocator.leader
            or last_s is None
            or self._clock() - last_s >= self._cluster.lease_ttl_s / 2
        )

    # -- one round ---------------------------------------------------------------------------------

    def _round(self, read: bool = True, pushed: tuple[float, int, int] | None = None) -> None:
        membership, holder = self._membership, self._holder
        try:
            if pushed is not None and not read and membership.lease_fresh():
                # Before a keep-alive that may be due: it waits for etcd.
                holder.follow_pushed(pushed, membership.claimed)
            lease_id = membership.ensure_lease()
            self._feed_budget()
            if pushed is not None and not read:
                holder.follow_pushed(pushed, membership.claimed)  # (nothing when it was applied above)
            membership.publish(lease_id, holder.applied(), defer_raise=True)
            if read:
                self._read_and_follow(lease_id)
                # What it applies now, at once (a deferred raise's report too).
                membership.publish(lease_id, holder.applied())
        except NodeNameTakenError as exc:
            holder.name_taken(exc)
        except LeaseLostError as exc:
            holder.failed(exc)
            membership.lease_lost()
        except ClusterError as exc:
            holder.failed(exc)
            holder.hold_while_lease_lives(membership.kept_alive_at_s)
        else:
            holder.reachable()

    def _feed_budget(self) -> None:
        """Request the budget the facility's file asks for, when it changed (see `perseusd.pool.feed`)."""
        if self._feed is None:
            return
        try:
            budget = self._feed.read()
        except ValueError as exc:
            if str(exc) != self._feed_error:
                logger.error("power pool %s: %s; the last budget stays requested", self._settings.pool, exc)
            self._feed_error = str(exc)
            return
        self._feed_error = None
        if budget is None or budget.encode() == self._fed:
            return
        self._store.txn([], [put_op(self._keys.request, budget.encode())])
        self._fed = budget.encode()
        logger.info(
            "power pool %s: budget %.1f W requested by %s", self._settings.pool, budget.budget_w, budget.by
        )

    def _read_and_follow(self, lease_id: int) -> None:
        """Read this node's part of the pool (the whole pool if it allocates or nobody does), apply it, and
        take the allocator's turn."""
        self._read_at_s = self._clock()
        keys = self._keys
        revision, entries = self._store.read_ranges(
            [(keys.allocator, prefix_end(keys.root + "budget/")), (keys.grant(self._node), None)]
        )
        self.reads += 1
        view = read_pool(keys, revision, entries)
        if view.allocator is None or view.allocator.lease_id != lease_id:
            self._allocator.leader = self._allocator.busy = False
            self._holder.follow(view, self._membership.claimed)
            if view.allocator is None:  # campaign on this small read; only the winner reads the pool
                self._allocator.round(view, lease_id)
                if self._allocator.busy:  # won: read the whole pool at the next round, not at the next poll
                    self._read_at_s = None
            return
        started_s = time.thread_time()
        revision, entries = self._store.range_prefix(keys.root)
        self.full_reads += 1
        view = read_pool(keys, revision, entries, self._decoded)
        self._holder.follow(view, self._membership.claimed)
        self._allocator.round(view, lease_id)
        if self._allocator.leader:
            self.allocator_cpu_s = [*self.allocator_cpu_s[-99:], time.thread_time() - started_s]

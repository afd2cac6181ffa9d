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
budget and the allocator key (one small request), and only when one of its two watches (`RangeWatch`: its
grant; the allocator key and the budget, deletions only) says they changed, or every half TTL (so a watch that
hangs costs latency, never correctness). Only the allocator, and a node that
finds no allocator, reads the whole pool, every round. The measured power in the report is published when it
moves by `POWER_REPORT_CHANGE` (at most every `POWER_REPORT_GAP_S`) or every `POWER_REPORT_EVERY_S`, not at
every measurement (each publication is an etcd write; a thousand nodes measuring every 2 s would be 500
writes a second). A new grant is applied from the watch event itself, without a read; a node that finds no
allocator campaigns on its small read, and only the winner reads the pool (a thousand nodes reading the
whole pool when the allocator dies would take etcd seconds).

What is applied:
- no budget in the pool: nothing (uncapped);
- this node's grant, once its report is written under its current lease (it holds its node name), whatever
  wrote the grant: a node that comes back finds the grant the pool kept reserved for it (no lease holds a
  grant; docs/power-pool.md, "Absent nodes");
- a budget but no grant for this node yet (it just joined, or its reservation was released): the safe cap,
  never above the last grant it applied;
- etcd unreachable: the last grant, until the lease would have expired (no renewal for a whole TTL; by then
  the allocator may have released its share, with policy "release"), then the safe cap, never above the last
  grant.

A clean stop deletes the node's report and grant in one transaction (its share goes back to the pool at
once), then revokes its lease.

The safe cap is the configured `safe_cap_w` (0: the node's floor). Nothing here blocks the daemon: the
target is called from this thread, which is why targets must be safe to call from any thread.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus_client.status_messages import PoolInfo

from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.etcd_store import (
    ClusterError,
    EtcdStore,
    LeaseLostError,
    compare_create,
    compare_lease,
    delete_op,
    prefix_end,
    put_op,
)
from perseusd.pool.allocator import (
    ABSENT_NODE_POLICIES,
    ETCD_MAX_TXN_OPS,
    HOLD,
    MAX_TXN_OPS,
    MIN_TXN_OPS,
    PoolAllocator,
)
from perseusd.pool.feed import BudgetFile, FeedSettings
from perseusd.pool.keys import Budget, NodeReport, PoolKeys, check_pool, decode_grant
from perseusd.pool.view import Decoded, PoolView, read_pool
from perseusd.power.target import NodePowerTarget
from perseusd.threads import NamedThread

if TYPE_CHECKING:
    from perseusd.cluster.etcd_watch import RangeWatch

logger = logging.getLogger(__name__)

UNCAPPED = "uncapped"
MEASURE_EVERY_S = 2.0
BUSY_ROUNDS_PER_INTERVAL = 5
"""An allocator that just moved grants, or awaits their acknowledgements, reads again this much sooner."""
POWER_REPORT_CHANGE = 0.1
POWER_REPORT_GAP_S = 15.0
"""A measured power is published again when it moved by this fraction (or 1 W) since the last one and that
one is this old..."""
POWER_REPORT_EVERY_S = 60.0
"""... or when the last one is this old."""


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


@dataclass(frozen=True)
class AgentStatus:
    """What this node applies and why."""

    pool: str
    applied_w: float | None
    reason: str
    """"uncapped", "grant", "safe cap (no grant yet)", "last grant (etcd unreachable)" or
    "safe cap (lease lapsed)"."""
    allocator: bool
    last_error: str | None
    budget_w: float | None = None
    """The active budget as last read (None: none, or not read yet)."""
    grant_w: float | None = None
    """This node's grant as last read."""
    budget_by: str | None = None
    """Who or what set the requested budget (an admin, or a facility signal and its file)."""
    budget_age_s: float | None = None
    """Seconds since the requested budget was set or its signal issued."""
    budget_signal: str | None = None
    """"fresh", "stale: last grants held" or "stale: safe caps" (an admin's budget is always fresh)."""


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
        self._cluster, self._settings, self._target = cluster, settings, target
        self._measure_w, self._clock = measure_w, clock
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
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._lease_id: int | None = None
        self._kept_alive_at_s: float | None = None
        self._written: str | None = None
        self._written_report: NodeReport | None = None
        self._applied_revision: int | None = None
        """The etcd revision of the grant whose watts this node applies (None: it applies no grant)."""
        self.deferred_reports = 0
        """Reports of a raised grant left to the next publication (see `_publish`)."""
        self._applied: tuple[float | None, str] | None = None
        self._last_grant_w: float | None = None
        self._budget_seen = False
        self._seen_budget_w: float | None = None
        self._seen_grant_w: float | None = None
        self._last_error: str | None = None
        self._wall_clock = wall_clock
        self._seen_request: Budget | None = None
        self._feed = None
        if settings.budget_file:
            feed = FeedSettings(Path(settings.budget_file), settings.budget_max_age_s, settings.budget_hold_s)
            self._feed = BudgetFile(feed)
        self._fed: str | None = None
        self._feed_error: str | None = None
        self._measured: float | None = None
        self._measured_at_s: float | None = None
        self._reported_at_s: float | None = None
        self._wake = threading.Event()
        self._watches = self._make_watches() if watch else []
        self._leader_watches: list[RangeWatch] = []
        """While this node allocates: its watches on the requested budget and on reports vanishing."""
        self._read_at_s: float | None = None
        self._pushed: tuple[float, int, int] | None = None
        """(grant W, lease, revision) from this node's grant watch, not applied yet."""
        self._pushed_read = False
        self._grant_revision = 0
        """The etcd revision of the grant last applied (an older one from the watch is ignored)."""
        self.pushed_applied = 0
        self.reads = self.full_reads = 0
        self._decoded: Decoded = {}
        """The reports and grants of the last full read, decoded (`read_pool`)."""
        self.allocator_cpu_s: list[float] = []
        """CPU time of this node's last allocator rounds (the full read, decoding, allocation, writes)."""

    # -- life cycle --------------------------------------------------------------------------------

    def _make_watches(self) -> list[RangeWatch]:
        from perseusd.cluster.etcd_watch import NO_PUT, RangeWatch

        endpoints, timeout_s = self._cluster.parsed_endpoints, self._cluster.timeout_s
        keys = self._keys
        return [
            RangeWatch(
                endpoints, keys.grant(self._node), None, self._grant_event, timeout_s, name="pool-grant"
            ),
            # "allocator" < "budget/..." < "grants/": the allocator key and the budgets, nothing else.
            RangeWatch(
                endpoints,
                keys.allocator,
                prefix_end(keys.root + "budget/"),
                self._woken,
                timeout_s,
                filters=(NO_PUT,),
                name="pool-budget",
            ),
        ]

    def _follow_leadership(self) -> None:
        """Open the allocator's own watches when this node becomes the allocator (a budget requested, a
        node's report gone: its lease expired or it left), close them when it no longer is: the allocator
        acts on those at once rather than at its next round. One node's two streams, not every node's."""
        leader = self._allocator.leader and bool(self._watches)
        if leader == bool(self._leader_watches):
            return
        if not leader:
            for watch in self._leader_watches:
                watch.stop()
            self._leader_watches = []
            return
        from perseusd.cluster.etcd_watch import NO_PUT, RangeWatch

        endpoints, timeout_s, keys = self._cluster.parsed_endpoints, self._cluster.timeout_s, self._keys
        self._leader_watches = [
            RangeWatch(endpoints, keys.request, None, self._woken, timeout_s, name="pool-request"),
            RangeWatch(
                endpoints,
                keys.nodes,
                prefix_end(keys.nodes),
                self._woken,
                timeout_s,
                filters=(NO_PUT,),
                name="pool-reports-gone",
            ),
        ]
        for watch in self._leader_watches:
            watch.start()

    def _woken(self, _events: object) -> None:
        self._wake.set()

    def _grant_event(self, events: list[dict[str, Any]]) -> None:
        """This node's grant changed: a new value is applied from the event itself, without a read (the
        allocator's moves reach a thousand nodes at once); a deletion, or a reconnection, makes a read."""
        pushed = None
        if events and events[-1].get("type", "PUT") == "PUT":
            kv = events[-1].get("kv", {})
            try:
                grant_w = decode_grant(base64.b64decode(kv.get("value", "")))
                pushed = (grant_w, int(kv.get("lease", 0)), int(kv.get("mod_revision", 0)))
            except (ValueError, TypeError):
                pushed = None
        with self._lock:
            self._pushed = pushed
            self._pushed_read = pushed is None
        self._wake.set()

    def start(self) -> None:
        for watch in self._watches:
            watch.start()
        self._thread = NamedThread(target=self._run, name="perseusd-power-pool", daemon=True)
        self._thread.start()

    def stop(self, revoke: bool = True, uncap: bool = True) -> None:
        """Stop; with `revoke`, drop out of the pool at once; with `uncap`, lift this node's cap."""
        self._stopping.set()
        self._wake.set()
        for watch in self._watches:
            watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=2 * self._store.attempts * self._cluster.timeout_s + 1.0)
        if self._thread is not None and self._thread.is_alive():
            # Stuck on etcd: the store is the thread's; the lease expires by itself.
            logger.warning("power pool: the agent did not stop in time; its lease will expire")
        else:
            if revoke and self._lease_id is not None:
                self._leave(self._lease_id)
            self._allocator.close()
            self._store.close()
        if uncap:
            self._apply(None, UNCAPPED)

    def _leave(self, lease_id: int) -> None:
        """Drop out of the pool: report and grant deleted together (only while the report is this lease's:
        a twin's are not touched), so the share goes back at once and no reservation is left; then the lease
        is revoked."""
        node_key = self._keys.node(self._node)
        try:
            self._store.txn(
                [compare_lease(node_key, lease_id)],
                [delete_op(self._keys.grant(self._node)), delete_op(node_key)],
            )
        except ClusterError as exc:
            logger.warning(
                "power pool %s: could not release this node's grant on stop (%s); it stays reserved until "
                "the node returns or an admin runs `perseusctl cap-pool release --pool %s %s`",
                self._settings.pool,
                exc,
                self._settings.pool,
                self._node,
            )
        try:
            self._store.revoke(lease_id)
        except ClusterError as exc:
            logger.warning("power pool: could not revoke lease %x on stop: %s", lease_id, exc)

    def status(self) -> AgentStatus:
        with self._lock:
            applied = self._applied or (None, UNCAPPED)
            error = self._last_error
            budget_w, grant_w = self._seen_budget_w, self._seen_grant_w
            request = self._seen_request
        now_s = self._wall_clock()
        return AgentStatus(
            self._settings.pool,
            applied[0],
            applied[1],
            self._allocator.leader,
            error,
            budget_w,
            grant_w,
            None if request is None else request.by,
            None if request is None else round(max(0.0, now_s - request.at_s), 1),
            None if request is None else request.freshness(now_s),
        )

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
            for watch in self._leader_watches:
                watch.stop()

    def _rounds(self) -> None:
        interval_s = self._cluster.refresh_interval_s
        while not self._stopping.is_set():
            self._wake.clear()
            with self._lock:
                pushed, must_read = self._pushed, self._pushed_read
                self._pushed, self._pushed_read = None, False
            self._round(must_read or self._read_due(), pushed)
            self._follow_leadership()
            busy = self._allocator.busy
            self._wake.wait(interval_s / BUSY_ROUNDS_PER_INTERVAL if busy else interval_s)

    def _read_due(self) -> bool:
        """Whether this round reads etcd without being woken: always without watches, as the allocator, and
        every half TTL (so a node whose watch hung applies a lowered grant before the allocator stops
        waiting for it, one TTL)."""
        last_s = self._read_at_s
        return (
            not self._watches
            or self._allocator.leader
            or last_s is None
            or self._clock() - last_s >= self._cluster.lease_ttl_s / 2
        )

    # -- one round ---------------------------------------------------------------------------------

    def _round(self, read: bool = True, pushed: tuple[float, int, int] | None = None) -> None:
        try:
            if pushed is not None and not read and self._lease_fresh():
                self._follow_pushed(pushed)  # before a keep-alive that may be due: it waits for etcd
            lease_id = self._ensure_lease()
            self._feed_budget()
            if pushed is not None and not read:
                self._follow_pushed(pushed)  # (nothing when it was applied above)
            self._publish(lease_id, defer_raise=True)
            if read:
                self._read_and_follow(lease_id)
                self._publish(lease_id)  # what it applies now, at once (a deferred raise's report too)
        except NodeNameTakenError as exc:
            with self._lock:
                if self._last_error != str(exc):
                    logger.error("power pool %s: %s", self._settings.pool, exc)
                self._last_error = str(exc)
            self._apply(self._safe_cap_w(), "safe cap (node name taken)")
        except LeaseLostError as exc:
            self._failed(exc)
            self._lease_id = None  # a new lease next round; the report is written again under it
        except ClusterError as exc:
            self._failed(exc)
            self._hold_while_lease_lives()
        else:
            with self._lock:
                if self._last_error is not None:
                    logger.info("power pool %s: etcd is reachable again", self._settings.pool)
                self._last_error = None

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
            self._follow(view)
            if view.allocator is None:  # campaign on this small read; only the winner reads the pool
                self._allocator.round(view, lease_id)
                if self._allocator.busy:  # won: read the whole pool at the next round, not at the next poll
                    self._read_at_s = None
            return
        started_s = time.thread_time()
        revision, entries = self._store.range_prefix(keys.root)
        self.full_reads += 1
        view = read_pool(keys, revision, entries, self._decoded)
        self._follow(view)
        self._allocator.round(view, lease_id)
        if self._allocator.leader:
            self.allocator_cpu_s = [*self.allocator_cpu_s[-99:], time.thread_time() - started_s]

    def _failed(self, exc: ClusterError) -> None:
        with self._lock:
            if self._last_error is None:
                logger.warning("power pool %s: %s", self._settings.pool, exc)
            self._last_error = str(exc)

    def _lease_fresh(self) -> bool:
        """Whether this node's lease was renewed within its TTL (as `_ensure_lease` keeps it)."""
        last_s = self._kept_alive_at_s
        return (
            self._lease_id is not None
            and last_s is not None
            and self._clock() - last_s < self._cluster.lease_ttl_s
        )

    def _ensure_lease(self) -> int:
        now_s, ttl_s = self._clock(), self._cluster.lease_ttl_s
        last_s = self._kept_alive_at_s
        if self._lease_id is not None and last_s is not None and now_s - last_s >= ttl_s:
            self._lease_id = None  # lapsed here: never revived, replaced (its keys are gone or going)
        if self._lease_id is None:
            self._lease_id, self._written = self._store.grant_lease(ttl_s), None
            self._kept_alive_at_s = now_s
            logger.info(
                "power pool %s: lease %x granted (TTL %d s)", self._settings.pool, self._lease_id, ttl_s
            )
        elif last_s is None or now_s - last_s >= self._cluster.keepalive_interval_s:
            self._store.keep_alive(self._lease_id)
            self._kept_alive_at_s = now_s
        return self._lease_id

    def _publish(self, lease_id: int, defer_raise: bool = False) -> None:
        """Write this node's report if it changed. With `defer_raise`, a report whose only change is a
        higher grant applied is left to the next publication (at the latest the next read, every half TTL):
        the allocator waits only for lowered grants, so a raise's report is off the pool's critical path,
        and one etcd write a node is saved at every raise."""
        with self._lock:
            applied_w = None if self._applied is None else self._applied[0]
            applied_revision = self._applied_revision
        report = NodeReport(
            round(self._target.power_demand_w(), 1),
            round(self._target.power_floor_w(), 1),
            {t: round(w, 1) for t, w in self._target.priority_demand_w().items()},
            self._settings.safe_cap_w,
            applied_w,
            self._measured_w(),
            applied_revision,
        )
        value = report.encode()
        if self._written is None:
            self._claim_node_name(value, lease_id)
        elif value == self._written or (defer_raise and self._only_raised(report)):
            if value != self._written:
                self.deferred_reports += 1
            return
        else:
            self._store.put(self._keys.node(self._node), value, lease_id)
        self._written, self._written_report = value, report

    def _only_raised(self, report: NodeReport) -> bool:
        """Whether `report` differs from the one written only by a higher grant applied, over a report that
        already named a grant's revision (so the allocator, which compares revisions for lowered grants,
        never takes the older report for an acknowledgement of a later lower)."""
        written = self._written_report
        if written is None or written.applied_w is None or written.applied_revision is None:
            return False
        if report.applied_w is None or report.applied_w < written.applied_w:
            return False
        return (
            replace(report, applied_w=written.applied_w, applied_revision=written.applied_revision) == written
        )

    def _claim_node_name(self, value: str, lease_id: int) -> None:
        """The first report under a lease: written only if no other lease holds this node's key, so two
        daemons with one node name never both take a share (`NodeNameTakenError` otherwise)."""
        key = self._keys.node(self._node)
        created, _revision = self._store.txn([compare_create(key, 0)], [put_op(key, value, lease_id)])
        if created:
            return
        held = [entry for entry in self._store.range_prefix(key)[1] if entry.key == key]
        if held and held[0].lease_id not in (0, lease_id):
            raise NodeNameTakenError(
                f"node name {self._node} is held in the pool under another lease ({held[0].lease_id:x}): "
                "another perseusd runs with this node name (set cluster_node_name), or this node's previous "
                f"run, whose lease expires within {self._cluster.lease_ttl_s} s; holding the safe cap"
            )
        self._store.put(key, value, lease_id)

    def _measured_w(self) -> float | None:
        """Measured node power, read at most every `MEASURE_EVERY_S` (the target's measure averages over the
        time between two reads), and the value published only when it moved enough or is old (see module)."""
        now_s = self._clock()
        if self._measured_at_s is None or now_s - self._measured_at_s >= MEASURE_EVERY_S:
            value_w = self._measure_w()
            self._measured_at_s = now_s
            if self._report_power(value_w, now_s):
                self._measured = None if value_w is None else round(value_w)
                self._reported_at_s = now_s
        return self._measured

    def _report_power(self, value_w: float | None, now_s: float) -> bool:
        last_w, last_s = self._measured, self._reported_at_s
        if last_s is None or now_s - last_s >= POWER_REPORT_EVERY_S or (value_w is None) != (last_w is None):
            return True
        return (
            value_w is not None
            and last_w is not None
            and abs(value_w - last_w) >= max(POWER_REPORT_CHANGE * last_w, 1.0)
        )

    def _follow_pushed(self, pushed: tuple[float, int, int]) -> None:
        """A grant from the watch: applied if this node holds its name under its lease and the grant is newer
        than the one applied (a grant exists only under an active budget, or as an absent node's
        reservation)."""
        grant_w, _grant_lease, revision = pushed
        if self._written is None or revision <= self._grant_revision:
            return
        self._grant_revision, self._budget_seen, self._last_grant_w = revision, True, grant_w
        with self._lock:
            self._seen_grant_w = grant_w
        self.pushed_applied += 1
        self._apply(grant_w, "grant", revision)

    def _follow(self, view: PoolView) -> None:
        """Apply what the pool says for this node (see module)."""
        self._budget_seen = view.request is not None or view.active is not None
        grant = view.grants.get(self._node)
        if grant is not None:
            if grant.entry.mod_revision < self._grant_revision:
                return  # the watch brought a newer one already
            self._grant_revision = grant.entry.mod_revision
        with self._lock:
            self._seen_budget_w = None if view.active is None else view.active.budget_w
            self._seen_request = view.request
            mine = grant is not None and self._written is not None  # this lease holds the node's name
            self._seen_grant_w = grant.grant_w if grant is not None and mine else None
        if not self._budget_seen:
            self._last_grant_w = None
            self._apply(None, UNCAPPED)
        elif grant is not None and mine:
            self._last_grant_w = grant.grant_w
            self._apply(grant.grant_w, "grant", grant.entry.mod_revision)
        else:
            self._apply(self._safe_cap_w(), "safe cap (no grant yet)")

    def _hold_while_lease_lives(self) -> None:
        """etcd is unreachable: keep the last grant while the lease may live, then the safe cap."""
        last_s = self._kept_alive_at_s
        if not self._budget_seen or last_s is None:
            return
        if self._clock() - last_s >= self._cluster.lease_ttl_s:
            self._apply(self._safe_cap_w(), "safe cap (lease lapsed)")
        elif self._applied is not None and self._applied[1] == "grant":
            self._apply(self._applied[0], "last grant (etcd unreachable)")

    def _safe_cap_w(self) -> float:
        safe_w = self._settings.safe_cap_w or self._target.power_floor_w()
        return safe_w if self._last_grant_w is None else min(safe_w, self._last_grant_w)

    def _apply(self, grant_w: float | None, reason: str, revision: int | None = None) -> None:
        """Hold `grant_w` (None: uncapped) for `reason`; a grant's `revision` is reported with it when its
        watts differ from what was applied (a grant rewritten with the same watts needs no new report)."""
        with self._lock:
            previous = self._applied
            self._applied = (grant_w, reason)
            if reason not in ("grant", "last grant (etcd unreachable)"):
                self._applied_revision = None
            elif revision is not None and (
                previous is None or previous[0] != grant_w or self._applied_revision is None
            ):
                self._applied_revision = revision
        if previous is None or previous[1] != reason:
            logger.info("power pool %s: %s (%s)", self._settings.pool, _watts(grant_w), reason)
        if previous is not None and previous[0] == grant_w:
            return
        try:
            self._target.apply_grant_w(grant_w)
        except Exception:  # the target's own failure never stops the pool
            logger.exception("power pool %s: applying %s failed", self._settings.pool, _watts(grant_w))


class NodeNameTakenError(ClusterError):
    """Another lease holds this node's key in the pool."""


def _watts(grant_w: float | None) -> str:
    return "no cap" if grant_w is None else f"{grant_w:.1f} W"

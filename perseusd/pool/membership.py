"""`NodeMembership`: a pool agent's node in the pool: its lease, its report under that lease, and leaving.

The lease is granted when there is none or the last one lapsed (no renewal for a whole TTL: never revived,
replaced), and kept alive every `keepalive_interval_s` (a third of the TTL). The first report under a lease
claims the node's name (written only if no other lease holds its key: two daemons with one node name never
both take a share); later ones are written when they changed. The report holds the demand, floor, priority
mix, safe cap, the grant applied with its etcd revision, and the measured power.

The measured power in the report is published when it moves by `POWER_REPORT_CHANGE` (at most every
`POWER_REPORT_GAP_S`) or every `POWER_REPORT_EVERY_S`, not at every measurement (each publication is an etcd
write; a thousand nodes measuring every 2 s would be 500 writes a second).

Leaving (a clean stop) deletes the node's report and grant in one transaction (its share goes back to the
pool at once), then revokes its lease. Not thread-safe: the pool agent's thread owns it
(`perseusd.pool.agent`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.etcd_store import (
    ClusterError,
    EtcdStore,
    compare_create,
    compare_lease,
    delete_op,
    put_op,
)
from perseusd.pool.keys import NodeReport, PoolKeys
from perseusd.power.target import NodePowerTarget

logger = logging.getLogger(__name__)

MEASURE_EVERY_S = 2.0
POWER_REPORT_CHANGE = 0.1
POWER_REPORT_GAP_S = 15.0
"""A measured power is published again when it moved by this fraction (or 1 W) since the last one and that
one is this old..."""
POWER_REPORT_EVERY_S = 60.0
"""... or when the last one is this old."""


class NodeNameTakenError(ClusterError):
    """Another lease holds this node's key in the pool."""


class NodeMembership:
    """This node's lease and report in the pool (see module)."""

    def __init__(
        self,
        store: EtcdStore,
        keys: PoolKeys,
        cluster: ClusterConfig,
        pool: str,
        safe_cap_w: float,
        target: NodePowerTarget,
        measure_w: Callable[[], float | None],
        clock: Callable[[], float],
    ) -> None:
        self._store, self._keys, self._cluster, self._pool = store, keys, cluster, pool
        self._node = cluster.node_name
        self._safe_cap_w, self._target, self._measure_w, self._clock = safe_cap_w, target, measure_w, clock
        self.lease_id: int | None = None
        self.kept_alive_at_s: float | None = None
        self._written: str | None = None
        self._written_report: NodeReport | None = None
        self.deferred_reports = 0
        """Reports of a raised grant left to the next publication (see `publish`)."""
        self._measured: float | None = None
        self._measured_at_s: float | None = None
        self._reported_at_s: float | None = None

    @property
    def claimed(self) -> bool:
        """Whether this node's report is written under its current lease (it holds its node name)."""
        return self._written is not None

    # -- the lease ---------------------------------------------------------------------------------

    def lease_fresh(self) -> bool:
        """Whether this node's lease was renewed within its TTL (as `ensure_lease` keeps it)."""
        last_s = self.kept_alive_at_s
        return (
            self.lease_id is not None
            and last_s is not None
            and self._clock() - last_s < self._cluster.lease_ttl_s
        )

    def ensure_lease(self) -> int:
        """This node's lease: granted when there is none or it lapsed, else kept alive when that is due."""
        now_s, ttl_s = self._clock(), self._cluster.lease_ttl_s
        last_s = self.kept_alive_at_s
        if self.lease_id is not None and last_s is not None and now_s - last_s >= ttl_s:
            self.lease_id = None  # lapsed here: never revived, replaced (its keys are gone or going)
        if self.lease_id is None:
            self.lease_id, self._written = self._store.grant_lease(ttl_s), None
            self.kept_alive_at_s = now_s
            logger.info("power pool %s: lease %x granted (TTL %d s)", self._pool, self.lease_id, ttl_s)
        elif last_s is None or now_s - last_s >= self._cluster.keepalive_interval_s:
            self._store.keep_alive(self.lease_id)
            self.kept_alive_at_s = now_s
        return self.lease_id

    def lease_lost(self) -> None:
        """etcd says the lease is gone: a new one next round; the report is written again under it."""
        self.lease_id = None

    def leave(self) -> None:
        """Drop out of the pool: report and grant deleted together (only while the report is this lease's:
        a twin's are not touched), so the share goes back at once and no reservation is left; then the lease
        is revoked. Nothing without a lease."""
        lease_id = self.lease_id
        if lease_id is None:
            return
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
                self._pool,
                exc,
                self._pool,
                self._node,
            )
        try:
            self._store.revoke(lease_id)
        except ClusterError as exc:
            logger.warning("power pool: could not revoke lease %x on stop: %s", lease_id, exc)

    # -- the report --------------------------------------------------------------------------------

    def publish(
        self, lease_id: int, applied: tuple[float | None, int | None], defer_raise: bool = False
    ) -> None:
        """Write this node's report if it changed; `applied`: the watts applied and their grant's revision
        (`GrantHolder.applied`). With `defer_raise`, a report whose only change is a higher grant applied is
        left to the next publication (at the latest the next read, every half TTL): the allocator waits only
        for lowered grants, so a raise's report is off the pool's critical path, and one etcd write a node is
        saved at every raise."""
        applied_w, applied_revision = applied
        report = NodeReport(
            round(self._target.power_demand_w(), 1),
            round(self._target.power_floor_w(), 1),
            {t: round(w, 1) for t, w in self._target.priority_demand_w().items()},
            self._safe_cap_w,
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

"""`AbsentNodes`: the pool's nodes whose report is gone, as the allocator sees them, and its writes for them.

A node whose report vanished (its lease expired: dead, frozen, cut off from etcd) keeps its grant as a
reservation (policy `hold`, the default): the budget less what the absent nodes may draw
(`GrantRecord.reserved_w`, or only the grant if the node was seen applying it) is divided among the nodes
that report, the allocator never deletes an absent node's grant, and logs it once. An absent node's grant is
marked absent (the time it was found so, for status and logs) only if the grant is still the one read. The
reservation ends when the node reports again (its grant is then its current one, moved like any other) or
when an admin releases it (`perseusd.pool.admin.release_node`). Policy `release` (nodes fenced out of band)
deletes an absent node's grant at the next round, only while its report is still gone. The allocator
(`perseusd.pool.allocator`) decides when these writes go, and in which transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from perseusd.cluster.etcd_store import compare_create, compare_mod, delete_op, put_op
from perseusd.pool.keys import GrantRecord, PoolKeys
from perseusd.pool.move_writer import Op
from perseusd.pool.view import Grant, PoolView

logger = logging.getLogger(__name__)

HOLD, RELEASE = "hold", "release"
ABSENT_NODE_POLICIES = (HOLD, RELEASE)
"""What the allocator does with an absent node's grant: keep it reserved until the node returns or an admin
releases it (`hold`), or hand it to the others (`release`: for nodes fenced out of band)."""


class AbsentNodes:
    """One node's allocator's absent nodes (see module). Not thread-safe: the pool agent's thread owns it."""

    def __init__(self, keys: PoolKeys, policy: str, wall_clock: Callable[[], float]) -> None:
        if policy not in ABSENT_NODE_POLICIES:
            raise ValueError(f"absent node policy must be one of {', '.join(ABSENT_NODE_POLICIES)}")
        self.release = policy == RELEASE
        """Policy `release`: absent nodes' grants are deleted, not reserved."""
        self._keys, self._wall_clock = keys, wall_clock
        self._logged: set[str] = set()
        self._acked_at: dict[str, int] = {}
        """Per node, the grant revision its last report seen named as applied (`remember_acks`)."""

    def remember_acks(self, view: PoolView) -> None:
        """The revision of the grant each node last reported applying, kept after its report is gone: a node
        that applied its lowered grant and then vanished is held to that grant, not to the higher one the
        grant still names (`held_w` stays until the grant's next write)."""
        for node, report in view.reports.items():
            if report.report.applied_revision is not None:
                self._acked_at[node] = report.report.applied_revision
        for node in [n for n in self._acked_at if n not in view.reports and n not in view.grants]:
            del self._acked_at[node]

    def find(self, view: PoolView) -> dict[str, Grant]:
        """The grants of nodes whose report is gone, each logged once (see module)."""
        absent = view.absent
        for node in [n for n in self._logged if n not in absent]:
            self._logged.discard(node)
            if node in view.reports:
                logger.info("power pool %s: node %s is back; it holds its grant again", self._keys.pool, node)
        for node, grant in sorted(absent.items()):
            if node in self._logged:
                continue
            self._logged.add(node)
            since_s = grant.absent_since_s if grant.absent_since_s is not None else self._wall_clock()
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since_s))
            if self.release:
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
                    self.reserved_w(node, grant),
                    self._keys.pool,
                    node,
                )
        return absent

    def reserved_w(self, node: str, grant: Grant) -> float:
        """What an absent node's GPUs may draw: its grant, or the higher one it may not have left."""
        return grant.grant_w if self._applied(node, grant) else grant.reserved_w

    def mark(self, view: PoolView, node: str) -> Op:
        """An absent node's grant, unchanged, with the time it was found absent (for status and logs):
        written only over the grant as read, so a grant an admin released since is never written back. The
        higher grant it carries goes if the node was seen applying this one."""
        grant = view.grants[node]
        held_w = None if self._applied(node, grant) else grant.held_w
        record = GrantRecord(grant.grant_w, held_w, round(self._wall_clock(), 1))
        key = self._keys.grant(node)
        return put_op(key, record.encode()), compare_mod(key, grant.entry.mod_revision)

    def drop(self, node: str) -> Op:
        """Policy "release": an absent node's grant deleted, only while its report is still gone."""
        return delete_op(self._keys.grant(node)), compare_create(self._keys.node(node), 0)

    def _applied(self, node: str, grant: Grant) -> bool:
        """Whether `node` was seen reporting `grant` (or a later one) applied."""
        return self._acked_at.get(node, 0) >= grant.entry.mod_revision

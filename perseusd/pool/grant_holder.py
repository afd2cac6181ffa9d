"""`GrantHolder`: what a pool agent's node applies through its `NodePowerTarget`, why, and what status shows.

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

The safe cap is the configured `safe_cap_w` (0: the node's floor). The pool agent's thread follows the pool
here (`perseusd.pool.agent`); `status` is read from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from perseusd.cluster.etcd_store import ClusterError
from perseusd.pool.keys import Budget
from perseusd.pool.view import PoolView
from perseusd.power.target import NodePowerTarget

logger = logging.getLogger(__name__)

UNCAPPED = "uncapped"


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


class GrantHolder:
    """What this node applies and why (see module). Followed from the pool agent's thread only."""

    def __init__(
        self,
        pool: str,
        node: str,
        target: NodePowerTarget,
        safe_cap_w: float,
        lease_ttl_s: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._pool, self._node, self._target, self._safe_cap_setting_w = pool, node, target, safe_cap_w
        self._lease_ttl_s, self._clock, self._wall_clock = lease_ttl_s, clock, wall_clock
        self._lock = threading.Lock()
        self._applied: tuple[float | None, str] | None = None
        self._applied_revision: int | None = None
        """The etcd revision of the grant whose watts this node applies (None: it applies no grant)."""
        self._last_grant_w: float | None = None
        self._budget_seen = False
        self._seen_budget_w: float | None = None
        self._seen_grant_w: float | None = None
        self._seen_request: Budget | None = None
        self._last_error: str | None = None
        self._grant_revision = 0
        """The etcd revision of the grant last applied (an older one from the watch is ignored)."""
        self.pushed_applied = 0

    def applied(self) -> tuple[float | None, int | None]:
        """The watts applied (None: none) and the etcd revision of the grant they are (for the report)."""
        with self._lock:
            return None if self._applied is None else self._applied[0], self._applied_revision

    def status(self, allocator: bool) -> AgentStatus:
        """What this node applies and why, as last followed; `allocator`: whether it allocates."""
        with self._lock:
            applied = self._applied or (None, UNCAPPED)
            error = self._last_error
            budget_w, grant_w = self._seen_budget_w, self._seen_grant_w
            request = self._seen_request
        now_s = self._wall_clock()
        return AgentStatus(
            self._pool,
            applied[0],
            applied[1],
            allocator,
            error,
            budget_w,
            grant_w,
            None if request is None else request.by,
            None if request is None else round(max(0.0, now_s - request.at_s), 1),
            None if request is None else request.freshness(now_s),
        )

    # -- etcd reached or not -----------------------------------------------------------------------

    def reachable(self) -> None:
        """A round reached etcd."""
        with self._lock:
            if self._last_error is not None:
                logger.info("power pool %s: etcd is reachable again", self._pool)
            self._last_error = None

    def failed(self, exc: ClusterError) -> None:
        """A round could not reach etcd (logged once until it can again)."""
        with self._lock:
            if self._last_error is None:
                logger.warning("power pool %s: %s", self._pool, exc)
            self._last_error = str(exc)

    def name_taken(self, exc: ClusterError) -> None:
        """Another lease holds this node's name in the pool: logged when new, and the safe cap held."""
        with self._lock:
            if self._last_error != str(exc):
                logger.error("power pool %s: %s", self._pool, exc)
            self._last_error = str(exc)
        self.apply(self.safe_cap_w(), "safe cap (node name taken)")

    # -- what the pool says ------------------------------------------------------------------------

    def follow_pushed(self, pushed: tuple[float, int, int], claimed: bool) -> None:
        """A grant from the watch: applied if this node holds its name under its lease (`claimed`) and the
        grant is newer than the one applied (a grant exists only under an active budget, or as an absent
        node's reservation)."""
        grant_w, _grant_lease, revision = pushed
        if not claimed or revision <= self._grant_revision:
            return
        self._grant_revision, self._budget_seen, self._last_grant_w = revision, True, grant_w
        with self._lock:
            self._seen_grant_w = grant_w
        self.pushed_applied += 1
        self.apply(grant_w, "grant", revision)

    def follow(self, view: PoolView, claimed: bool) -> None:
        """Apply what the pool says for this node (see module); `claimed`: its lease holds its name."""
        self._budget_seen = view.request is not None or view.active is not None
        grant = view.grants.get(self._node)
        if grant is not None:
            if grant.entry.mod_revision < self._grant_revision:
                return  # the watch brought a newer one already
            self._grant_revision = grant.entry.mod_revision
        with self._lock:
            self._seen_budget_w = None if view.active is None else view.active.budget_w
            self._seen_request = view.request
            mine = grant is not None and claimed
            self._seen_grant_w = grant.grant_w if grant is not None and mine else None
        if not self._budget_seen:
            self._last_grant_w = None
            self.apply(None, UNCAPPED)
        elif grant is not None and mine:
            self._last_grant_w = grant.grant_w
            self.apply(grant.grant_w, "grant", grant.entry.mod_revision)
        else:
            self.apply(self.safe_cap_w(), "safe cap (no grant yet)")

    def hold_while_lease_lives(self, kept_alive_at_s: float | None) -> None:
        """etcd is unreachable: keep the last grant while the lease may live, then the safe cap."""
        if not self._budget_seen or kept_alive_at_s is None:
            return
        if self._clock() - kept_alive_at_s >= self._lease_ttl_s:
            self.apply(self.safe_cap_w(), "safe cap (lease lapsed)")
        elif self._applied is not None and self._applied[1] == "grant":
            self.apply(self._applied[0], "last grant (etcd unreachable)")

    def safe_cap_w(self) -> float:
        safe_w = self._safe_cap_setting_w or self._target.power_floor_w()
        return safe_w if self._last_grant_w is None else min(safe_w, self._last_grant_w)

    def apply(self, grant_w: float | None, reason: str, revision: int | None = None) -> None:
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
            logger.info("power pool %s: %s (%s)", self._pool, _watts(grant_w), reason)
        if previous is not None and previous[0] == grant_w:
            return
        try:
            self._target.apply_grant_w(grant_w)
        except Exception:  # the target's own failure never stops the pool
            logger.exception("power pool %s: applying %s failed", self._pool, _watts(grant_w))


def _watts(grant_w: float | None) -> str:
    return "no cap" if grant_w is None else f"{grant_w:.1f} W"

"""Power-pool admin messages of the wire protocol (admin socket only): set a pool's budget, release an absent
node's reservation, read its status.

The daemon that receives them talks to etcd for the admin (it must be configured with the pool's etcd
endpoints). `perseus_client.protocol` registers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import Message
from perseus_client.version import since


@dataclass(frozen=True)
class PoolBudget(Message):
    """`pool`'s budget (W; None: none, every node of the pool uncapped): a request to set it and its reply."""

    pool: str
    budget_w: float | None


@dataclass(frozen=True)
class AdminPoolSetBudget(PoolBudget, wire_type="admin_pool_set_budget", since=1):
    """Set `pool`'s budget (W); None clears it (every node of the pool uncapped)."""


@dataclass(frozen=True)
class PoolBudgetOk(PoolBudget, wire_type="pool_budget_ok", since=1):
    by: str
    """Who set it, as logged (user and pid)."""


@dataclass(frozen=True)
class AdminPoolStatus(Message, wire_type="admin_pool_status", since=1):
    """Read `pool`'s budget, grants and node reports."""

    pool: str


@dataclass(frozen=True)
class NodeRelease(Message):
    """Absent `node`'s reservation in `pool`: a request to end it and its reply."""

    pool: str
    node: str


@dataclass(frozen=True)
class AdminPoolRelease(NodeRelease, wire_type="admin_pool_release", since=8):
    """End absent `node`'s reservation in `pool`: its grant is deleted (only while the node has no report),
    and its share goes to the other nodes. For a node known to draw nothing (powered off, fenced)."""


@dataclass(frozen=True)
class PoolReleaseOk(NodeRelease, wire_type="pool_release_ok", since=8):
    released_w: float
    """The reservation released (W)."""
    by: str
    """Who released it, as logged (user and pid)."""


@dataclass(frozen=True)
class PoolNode:
    """One node of a pool (W; None: unknown)."""

    node: str
    grant_w: float | None
    demand_w: float
    floor_w: float
    applied_w: float | None
    power_w: float | None
    """Measured node power as the node last published it."""
    reserved_w: float | None = since(8, None)
    """An absent node's reservation: its report is gone, its grant (or a higher one it may not have lowered
    to) stays out of the budget until it returns or an admin releases it. None: the node reports."""
    absent_since_s: float | None = since(8, None)
    """When the allocator found the node absent (Unix time; None while it reports, or not marked yet)."""


@dataclass(frozen=True)
class PoolStatusReply(Message, wire_type="pool_status", since=1):
    pool: str
    revision: int
    requested_w: float | None
    requested_by: str
    active_w: float | None
    """The budget the grants are held to (differs from `requested_w` while grants move)."""
    granted_w: float
    allocator: str | None
    problem: str | None
    """Why the budget cannot be met (below the sum of the floors), None when it can."""
    nodes: tuple[PoolNode, ...]
    requested_age_s: float | None = since(6, None)
    """Seconds since the requested budget was set (or its facility signal issued)."""
    signal: str | None = since(6, None)
    """"fresh", "stale: last grants held" or "stale: safe caps" (None: no budget)."""

"""Power-cap messages of the wire protocol (admin socket only): set or clear the node's power budget, read
the cap's status, set a job's priority tier. `perseus_client.protocol` registers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import JobMessage, Message


@dataclass(frozen=True)
class AdminSetCap(Message, wire_type="admin_set_cap", since=1):
    """Hold this node's GPUs within `budget_w` watts (replaces any earlier node budget)."""

    budget_w: float


@dataclass(frozen=True)
class AdminClearCap(Message, wire_type="admin_clear_cap", since=1):
    """Drop the node budget: power limits the cap wrote go back to what they were."""


@dataclass(frozen=True)
class AdminCapStatus(Message, wire_type="admin_cap_status", since=1):
    """Read the node power cap's status (`CapStatusReply`)."""


@dataclass(frozen=True)
class JobPriority(JobMessage):
    """A job's priority tier under a power cap: a request to set it and its reply."""

    priority: int


@dataclass(frozen=True)
class AdminSetJobPriority(JobPriority, wire_type="admin_set_job_priority", since=1):
    """Set a job's priority tier under a power cap: 0 low, 1 normal (default), 2 high; lower tiers are
    slowed first. The job must be on this node; its tier is bound to its owner and name."""


@dataclass(frozen=True)
class JobPriorityOk(JobPriority, wire_type="job_priority_ok", since=1):
    """The tier `job` now has."""


@dataclass(frozen=True)
class CapGpu:
    """One GPU under the cap."""

    uuid: str
    limit_w: float | None
    """The power limit the cap holds it at (W); None when the cap does not write it (uncapped)."""
    min_w: float
    max_w: float
    managed_by: str
    """The job whose plan the limit follows; "" for a GPU held by its limit alone."""


@dataclass(frozen=True)
class CapJob:
    """One running job under the cap: the point it runs and the slowdown the cap causes."""

    job: str
    priority: int
    point: int
    time_s: float
    uncapped_point: int
    uncapped_time_s: float
    slowdown: float
    """Iteration-time growth caused by the cap (0.05 = 5 %; 0 when the cap costs it nothing)."""
    power_w: float
    """Its planned average power on this node (W)."""


@dataclass(frozen=True)
class CapStatusReply(Message, wire_type="cap_status", since=1):
    active: bool
    budget_w: float | None
    """The node budget set with `perseusctl cap set --node` (None: none)."""
    pool_grant_w: float | None
    """The grant from a cluster pool (None: no pool)."""
    grant_w: float | None
    """What the node is held to: the lower of the two (None: uncapped)."""
    enforcement: str
    window_s: float
    measured_w: float | None
    """Node power averaged over the last enforcement window, from the energy counters (W)."""
    measured_span_s: float
    floor_w: float
    demand_w: float
    planned_w: float | None
    plan_target_w: float | None
    """What the plan aims at (W): the grant less 1 % headroom, trimmed when windows measured above it."""
    feasible: bool
    strict: bool
    problem: str
    """Why the cap cannot be met as planned ("" when it can)."""
    over_windows: int
    """Consecutive windows measured above the grant + 1 %."""
    set_by: str
    gpus: tuple[CapGpu, ...]
    jobs: tuple[CapJob, ...]

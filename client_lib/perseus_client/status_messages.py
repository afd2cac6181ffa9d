"""The status messages of the wire protocol: GPUs, leases, plans and the daemon's health (`perseusctl
status`). Kept apart so that a reader of status loads only these (`perseus_client.protocol` re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.carbon_messages import SignalInfo
from perseus_client.job_info import JobInfo
from perseus_client.message import Message
from perseus_client.version import since


@dataclass(frozen=True)
class StatusRequest(Message, wire_type="status"):
    """The daemon's health, its GPUs and jobs (on the admin socket: the full view)."""


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a GPU's lease: the process, its uid, its job (hidden from other non-admin users)."""

    pid: int
    uid: int
    job: str
    slurm_job: int | None = since(5, None)
    """The Slurm job of the holding process (its cgroup's, else its environment's; None: none)."""


@dataclass(frozen=True)
class PlanStats:
    """Per-computation switching of one GPU's plan: counters and event -> clock applied latency (ms)."""

    computations: int
    clock_changes: int
    skipped: int
    late: int
    unplanned: int
    errors: int
    early_raises: int
    """Higher clocks submitted before the running computation's expected end rather than at its end."""
    event_to_clock_p50_ms: float | None
    event_to_clock_p99_ms: float | None


@dataclass(frozen=True)
class GpuStatus:
    """One GPU row of a status reply; None means unavailable. `error` set: the GPU failed to answer."""

    uuid: str
    name: str
    sm_clock_mhz: int | None
    locked_clock_mhz: int | None
    power_w: float | None
    power_limit_w: float | None
    energy_j: float | None
    lease: LeaseInfo | None
    error: str | None
    call_ms: dict[str, float]
    plan: PlanStats | None = None
    power_capped: bool | None = None
    """The power cap holds the SM clock (`sm_clock_mhz`, the clock it actually runs at) below the locked or
    top clock: NVML's clock-event reasons; the simulator's: its last computation was capped. None: unknown."""
    power_features: tuple[str, ...] = since(5, ())
    """The driver's power features that can fight the daemon's clocks, each "name: state (detail)" (workload
    power profile, power smoothing; "not supported" on GPUs and drivers without them)."""
    index: int | None = since(8)
    """The GPU's index as the driver numbers it (`nvidia-smi`, `perseusctl measure --gpu`); None: unknown."""
    pci_bus_id: str = since(8, "")
    """The GPU's PCI bus id (`00000000:17:00.0`), as dcgm-exporter and `nvidia-smi` name it."""


@dataclass(frozen=True)
class DaemonHealth:
    """The daemon's version, protocol, uptime and counters."""

    version: str
    protocol: int
    pid: int
    uptime_s: float
    clients: int
    events_received: int
    events_dropped: int
    errors_by_code: dict[str, int]
    restores: int
    restore_failures: int
    last_restore_s: float | None
    auth_rejected: int
    persistence_error: str | None = None
    connections: int = 0
    """Client connections open now (control, events, admin)."""
    connections_refused: int = 0
    """Connections shut down at once because a limit was reached (docs/daemon.md, Limits)."""
    protocol_minor: int = since(1, 0)
    """The newest minor of `protocol` the daemon speaks."""
    monitor_only: bool = since(5, False)
    """The daemon only reads (energy, status) and never writes a clock or a limit."""
    backend: str = since(8, "")
    """The GPU backend: `nvml` (real GPUs), `sim` (simulated: no figure is a real GPU's) or `mixed`."""
    events_lost: int = since(9, 0)
    """Events clients sent that never reached the daemon, from their end markers (`events_end`): each
    session's `sent` less what the daemon read of it. Never part of `events_received`."""


@dataclass(frozen=True)
class PoolInfo:
    """This node's membership of a cluster power pool (docs/power-pool.md), as its pool agent sees it."""

    pool: str
    node: str
    target: str
    """How the grant is held: "frontier" (the node cap) or "uniform" (one power limit level)."""
    budget_w: float | None
    """The pool's active budget as last read from etcd (None: no budget)."""
    grant_w: float | None
    """This node's grant as last read (None: none yet, or no budget)."""
    applied_w: float | None
    """What the node holds now (the grant, its last grant or its safe cap; None: uncapped)."""
    reason: str
    """Why `applied_w`: "uncapped", "grant", "safe cap (no grant yet)", ...."""
    allocator: bool
    error: str | None
    budget_by: str | None = since(6, None)
    """Who or what set the requested budget: an admin (user, uid, pid) or a facility signal and its file."""
    budget_age_s: float | None = since(6, None)
    """Seconds since the requested budget was set (or its signal issued)."""
    budget_signal: str | None = since(6, None)
    """"fresh", "stale: last grants held" or "stale: safe caps" (docs/power-pool.md)."""


@dataclass(frozen=True)
class StatusReply(Message, wire_type="status_ok"):
    """The daemon's health, one row per GPU, the jobs the caller may see.

    (Every class of this module has a docstring: a dataclass without one costs a signature at import.)
    """

    daemon: DaemonHealth
    gpus: tuple[GpuStatus, ...]
    jobs: tuple[JobInfo, ...] = ()
    signal: SignalInfo | None = since(1, None)
    """The node's grid signal (None: none configured)."""
    pool: PoolInfo | None = since(2, None)
    """The node's power pool, to admin callers (None: not in a pool, or not an admin)."""

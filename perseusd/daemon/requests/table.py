"""The one table from a request's message type to its handler, for each socket, built once when the core is.

Which requests a daemon serves follows from its parts: job requests with a job manager, the power cap's with
a node cap, the pool's with etcd, Slurm's with the ledger. A message type has at most one handler per socket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perseus_client.cap_messages import AdminCapStatus, AdminClearCap, AdminSetCap, AdminSetJobPriority
from perseus_client.pool_messages import AdminPoolRelease, AdminPoolSetBudget, AdminPoolStatus
from perseus_client.protocol import (
    AdminReset,
    AdminSetPowerLimit,
    AdminSlurmEpilog,
    AdminSlurmProlog,
    AnnounceStraggler,
    Claim,
    ClearPlan,
    EnergyRead,
    EventCount,
    FrontierRequest,
    Hello,
    JobsRequest,
    Message,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    Register,
    Release,
    SetClock,
    SetPlan,
    SetPolicy,
    SlurmJobsRequest,
)

from perseusd.daemon.deferred import Deferred
from perseusd.daemon.requests.cap import CapRequests
from perseusd.daemon.requests.energy import EnergyRequests
from perseusd.daemon.requests.gpu import GpuRequests
from perseusd.daemon.requests.job import JobRequests
from perseusd.daemon.requests.slurm import SlurmRequests
from perseusd.leasing.identity import Caller

if TYPE_CHECKING:  # etcd3gw (the `cluster` extra) is imported only when the daemon is configured with etcd
    from perseusd.daemon.requests.pool import PoolRequests

Handler = Callable[[Caller, Any], Message | Deferred]
Handlers = Mapping[type[Message], Handler]


@dataclass(frozen=True)
class RequestTable:
    """Every request the daemon serves and its handler: on the control socket and on the admin socket (whose
    callers the core checks to be admins first)."""

    client: Handlers
    admin: Handlers


@dataclass(frozen=True)
class RequestFamilies:
    """The daemon's request handlers (None: the part that serves them is not configured)."""

    gpus: GpuRequests
    jobs: JobRequests | None = None
    energy: EnergyRequests | None = None
    slurm: SlurmRequests | None = None
    cap: CapRequests | None = None
    pool: PoolRequests | None = None


def request_table(families: RequestFamilies) -> RequestTable:
    """The table of `families`' requests (raises `ValueError` if a message type had two handlers)."""
    gpus, jobs, slurm, cap, pool = families.gpus, families.jobs, families.slurm, families.cap, families.pool
    client: list[Handlers] = [
        {
            Hello: gpus.hello,
            Claim: gpus.claim,
            Release: gpus.release,
            SetClock: gpus.set_clock,
            SetPlan: gpus.set_plan,
            ClearPlan: gpus.clear_plan,
            EventCount: gpus.event_count,
        }
    ]
    admin: list[Handlers] = [{AdminReset: gpus.admin_reset, AdminSetPowerLimit: gpus.admin_set_power_limit}]
    if jobs is not None:
        client.append(
            {
                Register: jobs.register,
                SetPolicy: jobs.set_policy,
                JobsRequest: jobs.jobs,
                FrontierRequest: jobs.frontier,
                PlanRequest: jobs.plan,
                ProfileExport: jobs.profile_export,
                ProfileImport: jobs.profile_import,
                AnnounceStraggler: jobs.announce_straggler,
            }
        )
    if families.energy is not None:
        client.append({EnergyRead: families.energy.read})
    if slurm is not None:
        client.append({SlurmJobsRequest: slurm.jobs})
        admin.append(
            {SlurmJobsRequest: slurm.jobs, AdminSlurmProlog: slurm.prolog, AdminSlurmEpilog: slurm.epilog}
        )
    if cap is not None:
        admin.append(
            {
                AdminSetCap: cap.set_budget,
                AdminClearCap: cap.clear_budget,
                AdminCapStatus: cap.status,
                AdminSetJobPriority: cap.set_priority,
            }
        )
    if pool is not None:
        admin.append(
            {
                AdminPoolSetBudget: pool.set_budget,
                AdminPoolStatus: pool.status,
                AdminPoolRelease: pool.release,
            }
        )
    return RequestTable(_joined(client), _joined(admin))


def _joined(parts: list[Handlers]) -> Handlers:
    table: dict[type[Message], Handler] = {}
    for part in parts:
        for kind, handler in part.items():
            if kind in table:
                raise ValueError(f"two handlers for {kind.TYPE}")
            table[kind] = handler
    return MappingProxyType(table)

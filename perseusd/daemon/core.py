"""The daemon core: requests in, replies out, no transport. The IPC layer decodes frames, attaches the
kernel-attested `Caller`, calls `handle`/`on_event`, and encodes what comes back.

`DaemonCore` extends the core's side of the event stream (`event_delivery.EventDelivery`: events applied and
counted, carried events told back) with requests, restore and status.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from perseus_client.protocol import (
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    AdminReset,
    AdminSetPowerLimit,
    DaemonHealth,
    ErrorCode,
    JobInfo,
    Message,
    PoolInfo,
    ProtocolError,
    StatusReply,
    StatusRequest,
)

from perseusd.cap.declared_cap import DeclaredCap
from perseusd.cap.node_cap import NodeCap
from perseusd.daemon.deferred import Deferred
from perseusd.daemon.event_delivery import EventDelivery
from perseusd.daemon.events import EventTracker
from perseusd.daemon.monitor_only import refuse_writes
from perseusd.daemon.past_jobs import PastJobs
from perseusd.daemon.requests.cap import CapRequests
from perseusd.daemon.requests.energy import EnergyRequests
from perseusd.daemon.requests.gpu import GpuRequests
from perseusd.daemon.requests.job import JobRequests
from perseusd.daemon.requests.slurm import SlurmRequests
from perseusd.daemon.requests.table import RequestFamilies, request_table
from perseusd.daemon.status import gpu_rows
from perseusd.daemon.wire_errors import protocol_error
from perseusd.errors import PerseusError
from perseusd.gpu.registry import GpuRegistry
from perseusd.jobs.manager import JobManager
from perseusd.leasing.gpu_access import GpuAccess
from perseusd.leasing.identity import Caller
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.restore import RestoreKeeper, RestoreOutcome
from perseusd.leasing.slurm_jobs import SlurmLedger
from perseusd.switching.plans import PlanBook

if TYPE_CHECKING:  # etcd3gw (the `cluster` extra) is imported only when the daemon is configured with etcd
    from perseusd.daemon.requests.pool import PoolRequests

logger = logging.getLogger(__name__)


class DaemonCore(EventDelivery):
    """Leases, GPU writes, restore and status, for callers the IPC layer has identified."""

    def __init__(
        self,
        registry: GpuRegistry,
        leases: LeaseBook,
        keeper: RestoreKeeper,
        tracker: EventTracker,
        *,
        version: str,
        is_admin: Callable[[Caller], bool],
        clock_s: Callable[[], float] = time.monotonic,
        plans: PlanBook,
        jobs: JobManager | None = None,
        energy: EnergyRequests | None = None,
        pool: PoolRequests | None = None,
        power_cap: NodeCap | None = None,
        protocol_minor: int = PROTOCOL_MINOR,
        pool_info: Callable[[], PoolInfo] | None = None,
        gpu_access: GpuAccess | None = None,
        monitor_only: bool = False,
        slurm: SlurmLedger | None = None,
        declared_cap: DeclaredCap | None = None,
        past_jobs: PastJobs | None = None,
        backend: str = "",
    ) -> None:
        self.backend = backend
        """The GPU backend (`nvml`, `sim`, `mixed`), for status: simulated figures are not a real GPU's."""
        self._declared_cap = declared_cap
        """A node budget declared in files (a Kubernetes ConfigMap), polled from `tick`."""
        self.slurm = slurm
        """Slurm jobs' GPU energy and their prolog/epilog (None: not kept)."""
        self.monitor_only = monitor_only
        """Reads only (`perseusd.daemon.monitor_only`): every request that would write is refused."""
        self._pool_info = pool_info
        """The node's power pool for admin status (None: not in a pool)."""
        self.power_cap = power_cap
        super().__init__(registry, leases, tracker, plans, jobs)
        self._job_requests = (
            JobRequests(jobs, self.plans, leases, is_admin, protocol_minor, past_jobs)
            if jobs is not None
            else None
        )
        self.keeper = keeper
        self._version = version
        self.protocol_minor = protocol_minor
        """The newest minor of `PROTOCOL_MAJOR` this daemon speaks (advertised in hello and status)."""
        self._is_admin = is_admin
        self._clock_s = clock_s
        self._started_s = clock_s()
        self.last_restore_s: float | None = None
        self.auth_rejected = 0
        self._connection_counts: Callable[[], tuple[int, int]] = lambda: (0, 0)
        gpu_requests = GpuRequests(
            registry,
            leases,
            keeper,
            self.plans,
            version=version,
            protocol_minor=protocol_minor,
            forget_gpu=self._forget,
            after_restore=self._restored,
            access=gpu_access,
            slurm=slurm,
        )
        self._gpu_requests = gpu_requests
        self._requests = request_table(
            RequestFamilies(
                gpu_requests,
                self._job_requests,
                energy,
                SlurmRequests(slurm, is_admin, self._release_leftovers) if slurm is not None else None,
                CapRequests(power_cap) if power_cap is not None else None,
                pool,
            )
        )
        """Every request's handler, for each socket (`perseusd.daemon.requests.table`)."""

    # ------------------------------------------------------------------ dispatch

    def handle(self, caller: Caller, message: Message, *, admin_socket: bool = False) -> Message | Deferred:
        """Handle one request: its reply, or one to build once GPU reads are done (`deferred`); raises
        `ProtocolError` for the IPC layer to turn into an error reply. A domain error (a `PerseusError`) is
        mapped here, by `wire_errors.protocol_error`, alike for every request."""
        try:
            return self._dispatch(caller, message, admin_socket=admin_socket)
        except PerseusError as exc:
            mapped = protocol_error(exc, message.TYPE)
            if mapped is None:
                raise
            raise mapped from None

    def _dispatch(self, caller: Caller, message: Message, *, admin_socket: bool) -> Message | Deferred:
        if self.monitor_only:
            refuse_writes(message)
        if isinstance(message, StatusRequest):
            return self.status(caller, admin=admin_socket and self._is_admin(caller))
        if admin_socket:
            return self._handle_admin(caller, message)
        handler = self._requests.client.get(type(message))
        if handler is None:
            if isinstance(message, AdminReset | AdminSetPowerLimit):
                raise ProtocolError(ErrorCode.PERMISSION_DENIED, "admin requests go to the admin socket")
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{message.TYPE} is not a request")
        return handler(caller, message)

    def _handle_admin(self, caller: Caller, message: Message) -> Message | Deferred:
        if not self._is_admin(caller):
            raise ProtocolError(
                ErrorCode.PERMISSION_DENIED, "admin requests need root or group perseus-admin"
            )
        handler = self._requests.admin.get(type(message))
        if handler is not None:
            return handler(caller, message)
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{message.TYPE} is not an admin request")

    def _restored(self, gpus: Sequence[str]) -> None:
        """These GPUs' limits were written outside the power cap (restored, or by an admin): it writes its
        own again."""
        if self.power_cap is not None:
            self.power_cap.after_restore(gpus)

    def _forget(self, gpu: str) -> None:
        """A lease ended: drop the GPU's open events, its plan and its place in a job."""
        self.tracker.forget(gpu)
        self.plans.drop(gpu)
        if self.slurm is not None:
            self.slurm.lease_ended(gpu)
        if self.jobs is not None:
            self.jobs.gpu_released(gpu)

    def _release_leftovers(self, gpus: list[str]) -> tuple[str, ...]:
        """A Slurm job's epilog: drop whatever leases remain on `gpus` and restore them."""
        for gpu in gpus:
            lease = self.leases.release(gpu)
            self._forget(gpu)
            if lease is not None:
                logger.warning("Slurm epilog: released GPU %s left leased by pid %d", gpu, lease.pid)
        outcome = self.keeper.restore(tuple(gpus))
        self._restored(gpus)
        return tuple(outcome.restored)

    # ------------------------------------------------------------------ the IPC layer's port
    #
    # The transport calls the core through these (and `handle`, `tick`, `shutdown`, and the event stream's in
    # `EventDelivery`) only: it never writes the core's counters nor reads the lease book itself.

    def count_rejected(self, code: ErrorCode) -> None:
        """A request answered with an error of `code`."""
        self.tracker.reject(code)

    def count_auth_rejected(self) -> None:
        """A connection refused by authentication."""
        self.auth_rejected += 1

    def advertise_event_socket(self, name: str | None) -> None:
        """The transport serves the SOCK_SEQPACKET event socket `name` (None: ZeroMQ's only): `hello_ok` says
        so to clients of minor 10 and later."""
        self._gpu_requests.event_socket = name

    def connections_from(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Where `health` reads the (open, refused) client connections from: the transport's books."""
        self._connection_counts = counts

    @property
    def session_count(self) -> int:
        """Client processes with a session (the connection limits allow them their own connections)."""
        return self.leases.session_count

    def client_pidfds(self) -> tuple[int, ...]:
        """The pidfds of the processes with a session, to poll: readable once the process has died."""
        return self.leases.pidfds()

    def pidfd_readable(self, pidfd: int) -> None:
        """A polled pidfd became readable: its process died, restore what it held."""
        pid = self.leases.pid_of_pidfd(pidfd)
        if pid is not None:
            self.client_died(pid)

    def tick(self) -> None:
        """Periodic work of the main loop: a state file write to retry, finished solves, waiting jobs."""
        self.keeper.retry_persist()
        if self.jobs is not None:
            self.jobs.tick()
        if self._job_requests is not None:
            self._job_requests.record_ended()
        if self._declared_cap is not None:
            try:
                self._declared_cap.poll()
            except Exception:  # a bad declaration never stops the main loop
                logger.exception("power cap: the declared budget could not be applied")
        if self.power_cap is not None:
            try:
                self.power_cap.tick()
            except Exception:  # the cap's trouble never stops the main loop; it is retried next tick
                logger.exception("power cap: tick failed")

    def busy(self) -> bool:
        """Whether a job is waiting for something the main loop must check soon."""
        if self.power_cap is not None and self.power_cap.active:
            return True
        return self.jobs is not None and any(job.active for job in self.jobs.jobs.values())

    # ------------------------------------------------------------------ lifecycle

    def client_died(self, pid: int) -> RestoreOutcome:
        """The process behind a session is gone (pidfd readable): restore every GPU it held."""
        started_s = self._clock_s()
        gpus = self.leases.drop_session(pid)
        for gpu in gpus:
            self._forget(gpu)
        outcome = self.keeper.restore(gpus)
        self._restored(gpus)
        if gpus:
            self.last_restore_s = self._clock_s() - started_s
            logger.info(
                "client %d died: restored %s in %.1f ms%s",
                pid,
                ", ".join(outcome.restored) or "nothing",
                self.last_restore_s * 1e3,
                f"; FAILED {', '.join(outcome.failed)}" if outcome.failed else "",
            )
        return outcome

    def shutdown(self) -> RestoreOutcome:
        """SIGTERM or a dying main loop: restore every saved GPU and forget all sessions.

        Each step is guarded, so that nothing before the restore can keep a GPU locked.
        """
        record = self._job_requests.record_ended if self._job_requests else None
        for step in (self.leases.close, record, self.plans.clear, self.jobs.close if self.jobs else None):
            if step is None:
                continue
            try:
                step()
            except Exception:
                logger.exception("shutdown: %s failed; restoring anyway", getattr(step, "__qualname__", step))
        return self.keeper.restore_all()

    # ------------------------------------------------------------------ status

    def status(self, caller: Caller, *, admin: bool) -> Deferred:
        """The status reply, built once every GPU's owner thread has read it (`deferred`)."""
        registry = self.registry
        reads = registry.submit_read_all()

        def finish() -> StatusReply:
            readings = {uuid: registry.settled_reading(uuid, future) for uuid, future in reads.items()}
            rows = gpu_rows(registry, readings, self.leases, self.keeper, self.plans, caller, admin)
            signal = self.jobs.carbon.signal_info() if self.jobs is not None else None
            pool = self._pool_info() if admin and self._pool_info is not None else None
            return StatusReply(
                daemon=self.health(), gpus=rows, jobs=self._visible_jobs(caller), signal=signal, pool=pool
            )

        return Deferred(tuple(reads.values()), finish, registry.call_timeout_s)

    def pool_info(self) -> PoolInfo | None:
        """This node's power pool (None: in none), for metrics."""
        return None if self._pool_info is None else self._pool_info()

    def _visible_jobs(self, caller: Caller) -> tuple[JobInfo, ...]:
        return self._job_requests.visible_jobs(caller) if self._job_requests is not None else ()

    def health(self) -> DaemonHealth:
        tracker = self.tracker
        connections, refused = self._connection_counts()
        return DaemonHealth(
            version=self._version,
            protocol=PROTOCOL_MAJOR,
            pid=os.getpid(),
            uptime_s=round(self._clock_s() - self._started_s, 3),
            clients=self.leases.session_count,
            events_received=tracker.received,
            events_dropped=tracker.dropped,
            events_lost=tracker.lost,
            errors_by_code=dict(tracker.errors_by_code),
            restores=self.keeper.restores,
            restore_failures=self.keeper.restore_failures,
            last_restore_s=self.last_restore_s,
            auth_rejected=self.auth_rejected,
            persistence_error=self.keeper.persistence_error,
            connections=connections,
            connections_refused=refused,
            protocol_minor=self.protocol_minor,
            monitor_only=self.monitor_only,
            backend=self.backend,
        )

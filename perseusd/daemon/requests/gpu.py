"""The GPU requests of the control and admin sockets: hello, claims and releases, clocks, plans, event counts,
the admin reset and power limits. Each takes the kernel-attested caller and checks its lease; the core
(`core.DaemonCore`) dispatches to them and owns what ends a lease (`forget_gpu`, `after_restore`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from perseus_client import protocol as wire

from perseusd.gpu.registry import GpuRegistry
from perseusd.leasing.gpu_access import GpuAccess
from perseusd.leasing.identity import Caller
from perseusd.leasing.leases import LeaseBook, Session
from perseusd.leasing.restore import RestoreKeeper
from perseusd.leasing.slurm_jobs import SlurmLedger
from perseusd.leasing.state_file import StateWriteError
from perseusd.records import project
from perseusd.switching.plans import PlanBook

logger = logging.getLogger(__name__)


class GpuRequests:
    """The leases and GPU writes of identified callers (no transport)."""

    def __init__(
        self,
        registry: GpuRegistry,
        leases: LeaseBook,
        keeper: RestoreKeeper,
        plans: PlanBook,
        *,
        version: str,
        protocol_minor: int,
        forget_gpu: Callable[[str], None],
        after_restore: Callable[[Sequence[str]], None],
        access: GpuAccess | None = None,
        slurm: SlurmLedger | None = None,
    ) -> None:
        self.slurm = slurm
        self.registry = registry
        self.access = access if access is not None else GpuAccess("off", registry.infos())
        """Which GPUs a caller's container and cgroup hold (`perseusd.leasing.gpu_access`)."""
        self.leases = leases
        self.keeper = keeper
        self.plans = plans
        self._version = version
        self.protocol_minor = protocol_minor
        self.event_socket: str | None = None
        """The SOCK_SEQPACKET event socket the transport serves (`DaemonCore.advertise_event_socket`)."""
        self._forget_gpu = forget_gpu
        """A lease ended: drop the GPU's open events, its plan and its place in a job."""
        self._after_restore = after_restore
        """These GPUs' limits were written outside the power cap (restored to their originals, or by an
        admin): it writes its own again."""

    def hello(self, caller: Caller, message: wire.Hello) -> wire.HelloOk:
        placement = self.access.placement(caller)
        session = self.leases.register(caller, message.job)
        session.placement = placement
        gpus = tuple(project(wire.GpuCapabilities, info) for info in self.registry.infos())
        return wire.HelloOk(
            daemon_version=self._version,
            protocol=wire.PROTOCOL_MAJOR,
            gpus=gpus,
            protocol_minor=self.protocol_minor,
            visible_gpus=self._visible(session),
            event_socket=self.event_socket,
        )

    def _visible(self, session: Session) -> tuple[str, ...] | None:
        """The GPUs the session's process may claim: its container's and cgroup's, and its Slurm job's."""
        visible = self.access.visible(session.placement)
        allowed = self.slurm.allowed(session.slurm_job) if self.slurm is not None else None
        if allowed is None:
            return visible
        return tuple(uuid for uuid in (visible or self.registry.uuids) if uuid in allowed)

    def claim(self, caller: Caller, message: wire.Claim) -> wire.ClaimOk:
        session = self.leases.require_session(caller)
        session.job = message.job
        self.access.check_claim(caller, session.placement, message.gpus)
        if self.slurm is not None:
            self.slurm.check_claim(session, message.gpus)
        for gpu in message.gpus:  # all or nothing: check every GPU before taking any
            self._require_known(gpu)
            self.leases.check_claim(caller, gpu)
        unsaved = [gpu for gpu in message.gpus if self.keeper.saved(gpu) is None]
        new = [gpu for gpu in message.gpus if gpu not in session.gpus]
        try:
            for gpu in message.gpus:
                self.keeper.ensure_saved(gpu)  # the original, durably, before any write
            for gpu in message.gpus:
                self.keeper.record_lease(gpu, self.leases.claim(session, gpu))
            self.keeper.persist()  # acknowledged only once the lease is on disk
        except StateWriteError:
            for gpu in new:  # undo: nothing was written to these GPUs under this claim
                if self.leases.holder(gpu) is not None:
                    self.leases.release(gpu)
                    self.keeper.record_lease(gpu, None)
            for gpu in unsaved:
                self.keeper.discard(gpu)
            raise
        if self.slurm is not None:
            self.slurm.leased(session, message.gpus)
        return wire.ClaimOk(gpus=message.gpus)

    def release(self, caller: Caller, message: wire.Release) -> wire.ReleaseOk:
        session = self.leases.require_session(caller)
        gpus = message.gpus or tuple(sorted(session.gpus))
        for gpu in gpus:
            self.leases.require_lease(caller, gpu)
        for gpu in gpus:
            self.leases.release(gpu)
            self._forget_gpu(gpu)
        outcome = self.keeper.restore(gpus)
        self._after_restore(gpus)
        return wire.ReleaseOk(gpus=outcome.restored, failed=outcome.failed)

    def set_clock(self, caller: Caller, message: wire.SetClock) -> wire.SetClockOk:
        self._require_known(message.gpu)
        self.leases.require_lease(caller, message.gpu)
        if message.sm_clock_mhz is not None:  # the same range set_plan accepts (then snapped alike)
            supported_mhz = self.registry.info(message.gpu).supported_sm_clocks_mhz
            low_mhz, high_mhz = min(supported_mhz, default=1), max(supported_mhz, default=1 << 20)
            if not low_mhz <= message.sm_clock_mhz <= high_mhz:
                raise wire.ProtocolError(
                    wire.ErrorCode.BAD_FIELD,
                    f"set_clock.sm_clock_mhz: {message.sm_clock_mhz} outside {low_mhz}..{high_mhz} MHz",
                )
        self.keeper.ensure_saved(message.gpu)
        applied = self.plans.set_clock(message.gpu, message.sm_clock_mhz)
        return wire.SetClockOk(gpu=message.gpu, applied_mhz=applied)

    def set_plan(self, caller: Caller, message: wire.SetPlan) -> wire.SetPlanOk:
        self._require_known(message.gpu)
        self.leases.require_lease(caller, message.gpu)
        self.keeper.ensure_saved(message.gpu)  # the plan writes clocks
        clocks_mhz = self.registry.info(message.gpu).supported_sm_clocks_mhz
        plan = self.plans.set(message.gpu, message.plan, clocks_mhz)
        return wire.SetPlanOk(gpu=message.gpu, computations=plan.computations)

    def clear_plan(self, caller: Caller, message: wire.ClearPlan) -> wire.ClearPlanOk:
        self._require_known(message.gpu)
        self.leases.require_lease(caller, message.gpu)
        return wire.ClearPlanOk(gpu=message.gpu, cleared=self.plans.drop(message.gpu))

    def event_count(self, caller: Caller, _message: wire.EventCount) -> wire.EventCountOk:
        session = self.leases.require_session(caller)
        return wire.EventCountOk(
            received=session.events_received, dropped=session.events_dropped, ended_sent=session.ended_sent
        )

    def admin_reset(self, _caller: Caller, message: wire.AdminReset) -> wire.AdminResetOk:
        gpus = message.gpus or self.registry.uuids
        for gpu in gpus:
            self._require_known(gpu)
        for gpu in gpus:
            lease = self.leases.release(gpu)
            self._forget_gpu(gpu)
            if lease is not None:
                logger.warning("admin reset: dropped lease of GPU %s held by pid %d", gpu, lease.pid)
        outcome = self.keeper.restore(gpus)
        self._after_restore(gpus)
        failed = list(outcome.failed)
        for gpu in gpus:
            try:
                self.registry.reset_locked_sm_clock(gpu)
            except Exception as exc:  # one GPU failing never stops the others
                logger.error("admin reset: unlocking GPU %s failed: %s", gpu, exc)
                if gpu not in failed:
                    failed.append(gpu)
        done = tuple(gpu for gpu in gpus if gpu not in failed)
        return wire.AdminResetOk(gpus=done, failed=tuple(failed))

    def admin_set_power_limit(self, _caller: Caller, message: wire.AdminSetPowerLimit) -> wire.PowerLimitOk:
        self._require_known(message.gpu)
        self.keeper.ensure_saved(message.gpu)
        try:
            enforced_w = self.registry.set_power_limit_w(message.gpu, message.power_limit_w)
        finally:
            self._after_restore((message.gpu,))  # a power cap writes its own limit again
        return wire.PowerLimitOk(gpu=message.gpu, requested_w=message.power_limit_w, enforced_w=enforced_w)

    def _require_known(self, gpu: str) -> None:
        if gpu not in self.registry:
            raise wire.ProtocolError(wire.ErrorCode.UNKNOWN_GPU, f"no GPU {gpu} on this node")

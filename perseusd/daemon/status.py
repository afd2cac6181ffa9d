"""Status assembly: one row per GPU (readings, lease, call times, plan, restore errors) for status replies.

Pure functions of what the core holds; the core (`core.DaemonCore.status`) adds its health and the jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from perseus_client.protocol import GpuStatus, LeaseInfo

from perseusd.gpu.backend import power_capped
from perseusd.gpu.reading import GpuReading
from perseusd.gpu.registry import GpuRegistry
from perseusd.leasing.identity import Caller
from perseusd.leasing.leases import Lease, LeaseBook
from perseusd.leasing.restore import RestoreKeeper
from perseusd.switching.plans import PlanBook


def gpu_rows(
    registry: GpuRegistry,
    readings: Mapping[str, GpuReading],
    leases: LeaseBook,
    keeper: RestoreKeeper,
    plans: PlanBook,
    caller: Caller,
    admin: bool,
) -> tuple[GpuStatus, ...]:
    """Every GPU's status row, in the registry's order, with each GPU's reading from `readings`."""
    stats = registry.stats()
    held = leases.leases()
    slurm_jobs = {}
    for gpu, lease in held.items():
        session = leases.session(lease.pid)
        slurm_jobs[gpu] = None if session is None else session.slurm_job
    return tuple(
        gpu_status(
            info.uuid,
            info.name,
            readings[info.uuid],
            held.get(info.uuid),
            stats,
            caller,
            admin,
            keeper,
            plans,
            slurm_job=slurm_jobs.get(info.uuid),
            power_features=tuple(f.text() for f in registry.power_features.get(info.uuid, ())),
            index=info.index,
            pci_bus_id=info.pci_bus_id,
        )
        for info in registry.infos()
    )


def gpu_status(
    uuid: str,
    name: str,
    reading: GpuReading,
    lease: Lease | None,
    stats: Mapping[str, Mapping[str, Mapping[str, float]]],
    caller: Caller,
    admin: bool,
    keeper: RestoreKeeper,
    plans: PlanBook,
    *,
    slurm_job: int | None = None,
    power_features: tuple[str, ...] = (),
    index: int | None = None,
    pci_bus_id: str = "",
) -> GpuStatus:
    """One GPU's status row; the job of another user's lease is hidden unless `admin`."""
    lease_info = None
    if lease is not None:
        own = admin or lease.uid == caller.uid
        lease_info = LeaseInfo(
            pid=lease.pid, uid=lease.uid, job=lease.job if own else "", slurm_job=slurm_job if own else None
        )
    saved = keeper.saved(uuid)
    error = reading.error or (
        f"restore failed: {saved.restore_error}" if saved and saved.restore_error else None
    )
    return GpuStatus(
        uuid=uuid,
        name=name,
        sm_clock_mhz=reading.sm_clock_mhz,
        locked_clock_mhz=reading.locked_sm_clock_mhz,
        power_w=reading.power_w,
        power_limit_w=reading.power_limit_w,
        energy_j=None if reading.energy_mj is None else reading.energy_mj / 1000.0,
        lease=lease_info,
        error=error,
        call_ms=call_times_ms(stats.get(uuid, {})),
        plan=plans.stats(uuid),
        power_capped=_capped(reading.clock_event_reasons),
        power_features=power_features,
        index=index,
        pci_bus_id=pci_bus_id,
    )


def call_times_ms(op_stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Mean GPU call time per operation (ms) from an owner's stats (`calls`, `total_s`)."""
    times: dict[str, float] = {}
    for op, values in op_stats.items():
        calls = values.get("calls", 0.0)
        if calls > 0 and "total_s" in values:
            times[op] = round(values["total_s"] / calls * 1e3, 4)
    return times


def _capped(reasons: int | None) -> bool | None:
    return None if reasons is None else power_capped(reasons)

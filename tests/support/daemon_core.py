"""A daemon core on simulated GPUs, without sockets, for unit tests of the core."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.events import EventTracker
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.sim import SimBackend
from perseusd.jobs.cache import JobCache
from perseusd.jobs.carbon_steering import CarbonSteering
from perseusd.jobs.manager import JobManager, JobSettings
from perseusd.jobs.solving import SolveWorker
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.registry import GpuRegistry
from perseusd.leasing.restore import RestoreKeeper
from perseusd.switching.energy_sampler import EnergySampler
from perseusd.switching.plans import PlanBook


@contextmanager
def sim_core(
    tmp_path: Path,
    gpus: int,
    *,
    jobs: JobSettings | None = None,
    model: str = "a100_sxm",
    carbon: CarbonSteering | None = None,
) -> Iterator[DaemonCore]:
    """A `DaemonCore` over `gpus` simulated GPUs with started owner threads; everything stopped on exit.

    With `jobs`, the core has a job manager (energy sampler thread, solver worker, cache in `tmp_path`).
    """
    backend = SimBackend(tmp_path / "sim", gpus=gpus, model=model, noise=0.0)
    owners = [GpuOwner(device) for device in backend.devices()]
    for owner in owners:
        owner.start()
    registry = GpuRegistry(owners, call_timeout_s=5.0)
    keeper = RestoreKeeper(registry, tmp_path / "state.json", os.getpid(), 1)
    leases = LeaseBook()
    plans = PlanBook(registry.submit_locked_sm_clock_mhz)
    sampler = EnergySampler(registry.submit_read_energy)
    manager = None
    if jobs is not None:
        cache = JobCache(tmp_path / "jobs")
        manager = JobManager(registry, plans, sampler, SolveWorker(), cache, jobs, carbon=carbon)
        sampler.start()
    try:
        yield DaemonCore(
            registry,
            leases,
            keeper,
            EventTracker(),
            version="test",
            is_admin=lambda caller: caller.uid == 0,
            plans=plans,
            jobs=manager,
        )
    finally:
        sampler.stop()
        if manager is not None:
            manager.close()
        leases.close()
        for owner in owners:
            owner.stop()
        backend.close()

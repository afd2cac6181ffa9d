"""A daemon core on simulated GPUs, without sockets, for unit tests of the core.

Assembled by the daemon's own composition function (`perseusd.daemon.main.daemon_core`), from a
configuration, over noise-free simulated GPUs of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.main import daemon_core
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.sim import SimBackend
from perseusd.jobs.carbon_steering import CarbonSteering
from perseusd.jobs.manager import JobSettings
from perseusd.leasing.registry import GpuRegistry


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

    State file `tmp_path / "state.json"`, job cache `tmp_path / "jobs"`; `jobs` replaces the job settings the
    configuration gives (defaults), `carbon` the carbon steering. Admins are uid 0. Clocks are raised when a
    computation begins (no early raise), as the core's unit tests expect.
    """
    config = DaemonConfig(
        backend="sim",
        sim_gpus=gpus,
        sim_model=model,
        runtime_dir=tmp_path / "run",
        state_dir=tmp_path,
        clock_lead_ms=0.0,
    )
    backend = SimBackend(tmp_path / "sim", gpus=gpus, model=model, noise=0.0)
    owners = [GpuOwner(device) for device in backend.devices()]
    for owner in owners:
        owner.start()
    registry = GpuRegistry(owners, call_timeout_s=5.0)
    try:
        with daemon_core(
            config, registry, lambda caller: caller.uid == 0, settings=jobs, carbon=carbon
        ) as core:
            try:
                yield core
            finally:
                core.leases.close()
    finally:
        for owner in owners:
            owner.stop()
        backend.close()

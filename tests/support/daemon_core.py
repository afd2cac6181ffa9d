"""A daemon core on simulated GPUs, without sockets, for unit tests of the core."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.events import EventTracker
from perseusd.daemon.leases import LeaseBook
from perseusd.daemon.registry import GpuRegistry
from perseusd.daemon.restore import RestoreKeeper
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.sim import SimBackend


@contextmanager
def sim_core(tmp_path: Path, gpus: int) -> Iterator[DaemonCore]:
    """A `DaemonCore` over `gpus` simulated GPUs with started owner threads; everything stopped on exit."""
    backend = SimBackend(tmp_path / "sim", gpus=gpus, noise=0.0)
    owners = [GpuOwner(device) for device in backend.devices()]
    for owner in owners:
        owner.start()
    registry = GpuRegistry(owners, call_timeout_s=5.0)
    keeper = RestoreKeeper(registry, tmp_path / "state.json", os.getpid(), 1)
    leases = LeaseBook()
    try:
        yield DaemonCore(
            registry, leases, keeper, EventTracker(), version="test", is_admin=lambda caller: caller.uid == 0
        )
    finally:
        leases.close()
        for owner in owners:
            owner.stop()
        backend.close()

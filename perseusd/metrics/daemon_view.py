"""What the metrics read of the daemon: its core's parts and reports, behind a protocol so that the
metrics sit below the daemon (`perseusd.daemon.core.DaemonCore` is one; the composition root hands it to
the collector)."""

from __future__ import annotations

from typing import Protocol

from perseus_client.protocol import DaemonHealth, PoolInfo

from perseusd.gpu.registry import GpuRegistry
from perseusd.jobs.manager import JobManager
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.slurm_jobs import SlurmLedger
from perseusd.switching.plans import PlanBook


class DaemonView(Protocol):
    """The daemon core as the collector reads it at scrape time (the main loop's objects, read-only)."""

    @property
    def registry(self) -> GpuRegistry: ...

    @property
    def leases(self) -> LeaseBook: ...

    @property
    def plans(self) -> PlanBook: ...

    @property
    def jobs(self) -> JobManager | None: ...

    @property
    def slurm(self) -> SlurmLedger | None: ...

    def pool_info(self) -> PoolInfo | None:
        """The node's power pool (None: not in a pool)."""

    def health(self) -> DaemonHealth:
        """The daemon's counters and uptime."""

"""Per-Slurm-job GPU energy (docs/slurm.md): the running jobs and the last ended ones the daemon keeps."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from perseusd.leasing.slurm_jobs import SlurmLedger
from perseusd.metrics.families import add_known, gauge

SLURM = ("slurm_job", "uid")


def slurm_families(ledger: SlurmLedger) -> Iterator[Metric]:
    leased = gauge(
        "slurm_job_leased_gpu_energy_joules", "GPU energy while the job's processes held leases", SLURM
    )
    allocated = gauge(
        "slurm_job_allocated_gpu_energy_joules", "Energy of the job's allocated GPUs, prolog to epilog", SLURM
    )
    running = gauge("slurm_job_running", "1 while the job runs (no epilog yet), 0 once ended", SLURM)
    for record in ledger.records():
        key = [str(record.job), str(record.uid)]
        leased.add_metric(key, record.leased_energy_j)
        add_known(allocated, key, record.allocated_energy_j)
        running.add_metric(key, 1.0 if record.state == "running" else 0.0)
    yield from (leased, allocated, running)

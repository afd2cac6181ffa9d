"""Fixtures of the Slurm tests: a daemon on 4 simulated GPUs and a real one-node Slurm beside it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster, missing_requirement, slurm_cluster
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.requirements import skip_unless_met


@dataclass
class SlurmNode:
    daemon: DaemonProcess
    cluster: SlurmCluster
    record: Path
    """The epilog's record file (one JSON line per job)."""
    metrics: Path
    """The daemon's textfile metrics."""


@pytest.fixture(scope="module")
def node() -> Iterator[SlurmNode]:
    skip_unless_met(missing_requirement())
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        metrics = dirs.base / "metrics"
        metrics.mkdir()
        config = dirs.base / "perseusd.toml"
        config.write_text(f'metrics_textfile_dir = "{metrics}"\nmetrics_textfile_interval_s = 1.0\n')
        env = {"PERSEUSD_SIM_UPDATE_PERIOD_S": "0.02"}
        daemon = make(dirs, gpus=4, env=env, extra_args=("--config", str(config))).start()
        record = dirs.base / "slurm-jobs.jsonl"
        with slurm_cluster(dirs.base / "slurm", dirs.runtime_dir, record) as cluster:
            yield SlurmNode(daemon, cluster, record, metrics / "perseusd.prom")

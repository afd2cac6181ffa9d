"""The carbon policy end to end: a real daemon replaying a fast trace that alternates a clean and a dirty
grid, a job driven with the client library: its point follows the grid, and `perseusctl jobs --json` shows
its carbon so far beside the same iterations' at all-max."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from perseus_client.client import PerseusClient

from tests.support.ctl import ctl_job
from tests.support.perseusd_proc import DaemonDirs, daemon_processes
from tests.support.synthetic import synthetic_profile
from tests.support.training import daemon_gpus, join_pipeline, run_iteration

pytestmark = pytest.mark.timeout(180)

JOB, STAGES, MICROBATCHES = "green", 2, 4
WAIT_S = 90.0


def _trace(path: Path) -> Path:
    """Hourly points alternating a clean (50) and a dirty (2000) grid for two days."""
    rows = ["timestamp,value"]
    for hour in range(48):
        rows.append(f"2024-01-0{1 + hour // 24}T{hour % 24:02d}:00:00+00:00,{2000 if hour % 2 else 50}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_carbon_job_follows_the_grid_and_counts_its_carbon(tmp_path: Path) -> None:
    env = {
        "PERSEUSD_SIGNAL_SOURCE": "trace",
        "PERSEUSD_SIGNAL_TRACE": str(_trace(tmp_path / "grid.csv")),
        "PERSEUSD_SIGNAL_TRACE_SPEED": "1800",  # an hour of the trace every 2 s
        "PERSEUSD_SIGNAL_POLL_S": "0.2",
        "PERSEUSD_CARBON_INTERVAL_S": "0.5",
        "PERSEUSD_CARBON_ETA": "0.9",
        "PERSEUSD_CARBON_FORECASTER": "persistence",
    }
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=STAGES, env=env).start()
        runtime_dir = daemon.dirs.runtime_dir
        with PerseusClient(runtime_dir, job=JOB, timeout_s=10.0) as client:
            gpus = daemon_gpus(client)
            profile = synthetic_profile(STAGES, seed=3, clocks_mhz=tuple(range(1410, 885, -45)))
            join_pipeline(client, gpus, profile, MICROBATCHES)
            client.set_policy("carbon", 0.3)
            points: set[int] = set()
            bases: set[str] = set()
            step = 0
            deadline_s = time.monotonic() + WAIT_S
            job = ctl_job(runtime_dir, JOB)
            while time.monotonic() < deadline_s:
                if job["state"] == "running":
                    run_iteration(client, gpus, step, MICROBATCHES)
                    step += 1
                job = ctl_job(runtime_dir, JOB)
                assert job["state"] in ("registered", "solving", "running"), job
                if job["plan_index"] is not None and job["carbon"]["basis"].startswith("forecast"):
                    points.add(job["plan_index"])
                    bases.add(job["carbon"]["basis"].split()[1])
                if len(points) >= 2 and job["carbon"]["carbon_g"] > 0 and job["carbon"]["all_max_carbon_g"]:
                    break
                time.sleep(0.1)
    assert bases == {"50.0", "2000.0"}, (bases, job)
    assert len(points) >= 2, (points, job)
    carbon = job["carbon"]
    assert carbon["carbon_g"] > 0
    assert carbon["all_max_basis"] == "predicted"  # the profile was imported: all-max never measured
    assert carbon["all_max_carbon_g"] > 0
    assert job["policy"] == "carbon"

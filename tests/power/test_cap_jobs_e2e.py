"""The node cap moving running jobs to slower frontier points, low priority first, on a real daemon.

One process claims both simulated GPUs and registers two one-stage jobs (one GPU each) with an imported
profile, so both solve and run at once (no events needed). The cap's budget sits between the node's floor
and its demand; what is asserted is what the daemon deployed (`perseusctl jobs`) and reports (`cap status`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from perseus_client.client import PerseusClient

from perseusd.planner.profile_csv import profile_to_csv
from tests.support.perseusd_proc import DaemonDirs, daemon_processes
from tests.support.synthetic import synthetic_profile

pytestmark = pytest.mark.timeout(180)

JOBS = ("cap-low", "cap-high")
WAIT_S = 60.0


def ctl(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(runtime_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def jobs(runtime_dir: Path) -> dict[str, dict[str, Any]]:
    out = ctl(runtime_dir, "jobs", "--json")
    assert out.returncode == 0, out.stderr
    return {j["job"]: j for j in json.loads(out.stdout)["jobs"]}


def cap_status(runtime_dir: Path) -> dict[str, Any]:
    out = ctl(runtime_dir, "cap", "status", "--json")
    assert out.returncode == 0, out.stderr
    status: dict[str, Any] = json.loads(out.stdout)
    return status


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    with daemon_processes() as make:
        run = make(DaemonDirs.create(), gpus=2).start().dirs.runtime_dir
        with PerseusClient(run, job=JOBS[0], timeout_s=10.0) as client:
            assert client.daemon_info is not None
            gpus = [gpu.uuid for gpu in client.daemon_info.gpus]
            profile = profile_to_csv(synthetic_profile(1, seed=5, clocks_mhz=tuple(range(1410, 885, -90))))
            client.claim(gpus)
            for job, gpu in zip(JOBS, gpus, strict=True):
                client.profile_import(profile, source="synthetic", p_block_w=80.0, job=job)
                client.register(gpu, stage=0, num_stages=1, num_microbatches=2, job=job)
            deadline_s = time.monotonic() + WAIT_S
            while any(j["state"] != "running" for j in jobs(run).values()):
                assert time.monotonic() < deadline_s, jobs(run)
                time.sleep(0.1)
            yield run


def test_low_priority_job_slowed_first_then_released(runtime_dir: Path) -> None:
    run = runtime_dir
    assert ctl(run, "cap", "priority", "cap-low", "low").returncode == 0
    assert ctl(run, "cap", "priority", "cap-high", "high").returncode == 0
    uncapped = {name: job["plan_index"] for name, job in jobs(run).items()}
    status = cap_status(run)
    floor_w, demand_w = status["floor_w"], status["demand_w"]
    assert floor_w < demand_w
    budget_w = demand_w - 0.15 * (demand_w - floor_w)  # the low job alone can give this much
    assert ctl(run, "cap", "set", "--node", f"{budget_w:.1f}").returncode == 0
    status = cap_status(run)
    by_job = {j["job"]: j for j in status["jobs"]}
    assert status["feasible"]
    assert status["planned_w"] <= budget_w + 1e-6
    assert by_job["cap-high"]["slowdown"] == 0.0
    assert by_job["cap-low"]["slowdown"] > 0.0
    deployed = jobs(run)
    low_point = by_job["cap-low"]["point"]
    assert [p["plan_index"] for p in deployed["cap-low"]["pipelines"]] == [low_point]
    assert [p["plan_index"] for p in deployed["cap-high"]["pipelines"]] == [uncapped["cap-high"]]
    assert all(g["limit_w"] is not None and g["managed_by"] for g in status["gpus"])

    assert ctl(run, "cap", "clear").returncode == 0
    deployed = jobs(run)
    for name in JOBS:
        assert [p["plan_index"] for p in deployed[name]["pipelines"]] == [uncapped[name]]
    assert cap_status(run)["jobs"] == []

"""The node cap moving running jobs to slower frontier points, low priority first, on a real daemon.

One process claims both simulated GPUs and registers two one-stage jobs (one GPU each) with an imported
profile, so both solve and run at once (no events needed). The cap's budget sits between the node's floor
and its demand; what is asserted is what the daemon deployed (`perseusctl jobs`) and reports (`cap status`).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from perseus_client.client import PerseusClient

from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.ctl import run_ctl
from tests.support.perseusd_proc import DaemonDirs, daemon_processes, sim_control
from tests.support.synthetic import synthetic_profile
from tests.support.training import daemon_gpus

pytestmark = pytest.mark.timeout(180)

JOBS = ("cap-low", "cap-high")
WAIT_S = 60.0


def jobs(runtime_dir: Path) -> dict[str, dict[str, Any]]:
    out = run_ctl(runtime_dir, "jobs", "--json")
    assert out.returncode == 0, out.stderr
    return {j["job"]: j for j in json.loads(out.stdout)["jobs"]}


def cap_status(runtime_dir: Path) -> dict[str, Any]:
    out = run_ctl(runtime_dir, "cap", "status", "--json")
    assert out.returncode == 0, out.stderr
    status: dict[str, Any] = json.loads(out.stdout)
    return status


@contextlib.contextmanager
def _two_jobs(profile: Profile, env: dict[str, str] | None = None) -> Iterator[Path]:
    with daemon_processes() as make:
        run = make(DaemonDirs.create(), gpus=2, env=env or {}).start().dirs.runtime_dir
        with PerseusClient(run, job=JOBS[0], timeout_s=10.0) as client:
            gpus = daemon_gpus(client)
            client.claim(gpus)
            for job, gpu in zip(JOBS, gpus, strict=True):
                client.profile_import(profile_to_csv(profile), source="synthetic", p_block_w=80.0, job=job)
                client.register(gpu, stage=0, num_stages=1, num_microbatches=2, job=job)
            deadline_s = time.monotonic() + WAIT_S
            while any(j["state"] != "running" for j in jobs(run).values()):
                assert time.monotonic() < deadline_s, jobs(run)
                time.sleep(0.1)
            yield run


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    with _two_jobs(synthetic_profile(1, seed=5, clocks_mhz=tuple(range(1410, 885, -90)))) as run:
        yield run


def _energy_rises_below_1050_mhz() -> Profile:
    """Power falls with the clock all the way down, energy only down to 1050 MHz: the frontier's slowest
    point runs 1050 MHz and the clocks below it draw less power (what a power limit can still use)."""
    rows = []
    for clock in range(1410, 865, -90):
        x = clock / 1410
        stretch = {960: 1.3, 870: 1.7}.get(clock, 1.0)
        for instruction, base_s in ((Instruction.FORWARD, 0.03), (Instruction.BACKWARD, 0.06)):
            time_s = base_s / x * stretch
            rows.append(Measurement(0, instruction, clock, time_s, (60 + 240 * x * x) * time_s))
    return Profile.from_measurements(rows, "test")


def test_low_priority_job_slowed_first_then_released(runtime_dir: Path) -> None:
    run = runtime_dir
    assert run_ctl(run, "cap", "priority", "cap-low", "low").returncode == 0
    out = run_ctl(run, "cap", "priority", "cap-high", "high")
    assert out.returncode == 0, out.stderr
    assert "priority high (2)" in out.stdout
    uncapped = {name: job["plan_index"] for name, job in jobs(run).items()}
    status = cap_status(run)
    floor_w, demand_w = status["floor_w"], status["demand_w"]
    assert floor_w < demand_w
    budget_w = demand_w - 0.15 * (demand_w - floor_w)  # the low job alone can give this much
    assert run_ctl(run, "cap", "set", "--node", f"{budget_w:.1f}").returncode == 0
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

    assert run_ctl(run, "cap", "clear").returncode == 0
    deployed = jobs(run)
    for name in JOBS:
        assert [p["plan_index"] for p in deployed[name]["pipelines"]] == [uncapped[name]]
    assert cap_status(run)["jobs"] == []


def test_below_the_slowest_points_limits_fitted_on_the_jobs_dags() -> None:
    """A budget below what the slowest frontier points draw: power limits below the plans' peaks, sized on
    each job's DAG under the limits (not one level summing to the budget), the modelled slowdown shown."""
    with _two_jobs(_energy_rises_below_1050_mhz()) as run:
        _check_fitted_limits(run)


def _check_fitted_limits(run: Path) -> None:
    status = cap_status(run)
    assert run_ctl(run, "cap", "set", "--node", f"{status['floor_w'] + 1:.1f}").returncode == 0
    found = re.search(r"the slowest points draw (\d+) W", cap_status(run)["problem"])  # and nothing fits
    assert found is not None
    budget_w = 0.95 * float(found.group(1))
    assert run_ctl(run, "cap", "set", "--node", f"{budget_w:.1f}").returncode == 0
    status = cap_status(run)
    assert status["feasible"]
    assert not status["strict"], json.dumps(status)
    assert "power limits of at most" in status["problem"]
    assert status["planned_w"] <= budget_w + 1e-6
    assert all(j["slowdown"] > 0 for j in status["jobs"])
    assert all(g["limit_w"] < g["max_w"] for g in status["gpus"])
    assert run_ctl(run, "cap", "clear").returncode == 0


def test_strict_enforcement_is_a_hard_line_with_jobs_running() -> None:
    """`strict`: whatever the jobs' points, the GPUs' power limits (as the GPUs hold them) sum to at most
    the grant, so nothing on the node can draw more."""
    profile = synthetic_profile(1, seed=5, clocks_mhz=tuple(range(1410, 885, -90)))
    with _two_jobs(profile, {"PERSEUSD_POWER_CAP_ENFORCEMENT": "strict"}) as run:
        status = cap_status(run)
        budget_w = status["floor_w"] + 0.5 * (status["demand_w"] - status["floor_w"])
        assert run_ctl(run, "cap", "set", "--node", f"{budget_w:.1f}").returncode == 0
        status = cap_status(run)
        assert status["enforcement"] == "strict"
        assert status["strict"]
        held_w = [sim_control(run, g["uuid"]).power_limit_w for g in status["gpus"]]
        assert sum(held_w) <= budget_w + 1e-6
        assert status["limits_sum_w"] == pytest.approx(sum(held_w))
        assert "<= grant (hard line)" in run_ctl(run, "cap", "status").stdout

"""The whole closed loop through perseus-emulate: register, (profile,) solve, run the plan, measure it.

Needs the daemon's job manager (`perseusd/jobs`). The fast test imports the profile so the job skips online
profiling; the slow one lets the daemon profile online.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.emulate.helpers import run_emulate
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

CLOSED_LOOP_STATES = {"registering", "registered", "profiling", "solving", "running"}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """4 simulated A100s with a fast energy counter and every 6th clock profiled (these tests are about the
    loop; the accuracy of profiling is tests/profiling's)."""
    env = {"PERSEUSD_SIM_UPDATE_PERIOD_S": "0.02", "PERSEUSD_PROFILE_CLOCK_STRIDE": "6"}
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=4, env=env).start()


def _check_report(report: dict[str, Any]) -> None:
    assert report["failure"] is None
    for phase in ("baseline", "optimized"):
        assert report[phase]["iteration_time_s"] > 0
        assert report[phase]["energy_per_iteration_j"] > 0
    assert report["saving_pct"] > 0
    # No slowdown, as planned (the measured slowdown is wall-clock time, a benchmark's business:
    # bench_closed_loop.py): the deployed point is predicted no slower than all-max on the job's profile.
    (job,) = report["daemon_jobs"]
    assert job["plan_time_s"] <= job["all_max_time_s"] * (1 + 1e-9)
    assert set(report["profiling"]) >= {"iterations", "energy_j"}
    assert report["plan"]["state"] == "running"
    assert report["plan"]["plan_index"] is not None
    assert report["plan"]["clock_changes_per_iteration"] is not None
    phases = [row["phase"] for row in report["iterations"]]
    assert phases[-1] == "running"
    assert set(phases) <= {"warmup", "baseline"} | CLOSED_LOOP_STATES


def test_imported_profile_job_reaches_running_and_saves_energy(daemon: DaemonProcess) -> None:
    """4 stages x 4 microbatches: the plan saves about 10 % by the profile at no slowdown."""
    out = run_emulate(
        daemon.dirs.runtime_dir,
        "--profile", "a100_sxm", "--stages", "4", "--microbatches", "4", "--time-scale", "0.2",
        "--iterations", "5", "--import-profile", "--json", "--timeout-s", "90",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_report(report)
    assert report["profiling"]["iterations"] == 0  # the imported profile replaces online profiling


@pytest.mark.slow
def test_online_profiling_job_reaches_running_and_saves_energy(daemon: DaemonProcess) -> None:
    out = run_emulate(
        daemon.dirs.runtime_dir,
        "--profile", "a100_sxm", "--stages", "4", "--microbatches", "4", "--time-scale", "0.25",
        "--iterations", "5", "--json", "--timeout-s", "200",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_report(report)
    assert report["profiling"]["iterations"] > 0
    assert report["profiling"]["energy_j"] > 0

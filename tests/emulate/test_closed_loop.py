"""The whole closed loop through perseus-emulate: register, (profile,) solve, run the plan, measure it.

Needs the daemon's job manager (`perseusd/jobs`). The fast test imports the profile so the job skips online
profiling; the slow one lets the daemon profile online.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseusd.emulate.trace import read_trace
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import Instruction
from perseusd.planner.profile_csv import read_profile
from tests.emulate.helpers import run_emulate
from tests.support.ctl import run_ctl
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
    # bench_closed_loop.py): the deployed point is predicted no slower than all-max on the job's profile, or,
    # when no point of the frontier is (a point followed under the measured clock-set latency can take a
    # fraction of a percent longer than the profile's all-max), the policy's fallback: the fastest point.
    (job,) = report["daemon_jobs"]
    if job["plan_time_s"] > job["all_max_time_s"] * (1 + 1e-9):
        assert job["plan_time_s"] == job["fastest_time_s"] > job["all_max_time_s"]
        assert job["plan_time_s"] <= job["all_max_time_s"] * 1.01
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


@pytest.mark.slow
def test_a_tensor_parallel_stage_is_profiled_and_switched_as_one(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """2 stages of 2 GPUs each: every computation starts at one clock on both GPUs of its stage (profiling
    sets the followers the lead's clocks at the same moment; the plan is the stage's), and the stage's
    measured energy is both GPUs'."""
    trace = tmp_path / "trace.jsonl"
    out = run_emulate(
        daemon.dirs.runtime_dir,
        "--profile", "a100_sxm", "--stages", "2", "--microbatches", "4", "--time-scale", "0.25",
        "--iterations", "5", "--tensor-parallel", "2", "--json", "--timeout-s", "200", "--trace", str(trace),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_report(report)
    (job,) = report["daemon_jobs"]
    assert job["stage_gpus"] == 2
    assert report["profiling"]["iterations"] > 0
    runs = [r for r in read_trace(trace) if r["kind"] == "computation" and r["iteration"] > 0]
    apart = [r for r in runs if len(set(r["clocks_mhz"])) > 1]
    assert len(runs[0]["clocks_mhz"]) == 2
    assert len(apart) <= 0.05 * len(runs)  # at most a switch landing between the two GPUs' starts
    exported = run_ctl(
        daemon.dirs.runtime_dir,
        "profile",
        "export",
        report["job"],
        "-o",
        str(tmp_path / "measured.csv"),
        timeout_s=60,
    )
    assert exported.returncode == 0, exported.stderr
    measured = read_profile(tmp_path / "measured.csv")
    one_gpu = bundled_profile("a100_sxm").scaled(0.25, 0.25)
    top = max(m.freq_mhz for m in measured.measurements)
    ratio = (
        measured.lookup(0, Instruction.FORWARD, top).energy_j
        / one_gpu.lookup(0, Instruction.FORWARD, top).energy_j
    )
    assert 1.6 < ratio < 2.4  # the stage's energy is its two GPUs'


def _plan_clocks(daemon: DaemonProcess, job: str) -> dict[str, list[int]]:
    """The running plan's clocks of every computation, by instruction (`perseusctl plan JOB --json`)."""
    shown = run_ctl(daemon.dirs.runtime_dir, "plan", job, "--json")
    assert shown.returncode == 0, shown.stderr
    clocks: dict[str, list[int]] = {}
    for stage in json.loads(shown.stdout)["stages"]:
        for entry in stage:
            clocks.setdefault(entry["instruction"], []).append(entry["freq_mhz"])
    return clocks


def test_a_zero_bubble_job_is_profiled_by_halves_planned_and_run(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """zbv profiled online: the daemon measures forward, input and weight gradients apart at the clocks it
    sweeps, plans them apart and runs the plan, saving energy."""
    out = run_emulate(
        daemon.dirs.runtime_dir,
        "--profile", "a100_sxm", "--stages", "2", "--microbatches", "4", "--schedule", "zbv", "--chunks", "2",
        "--time-scale", "0.25", "--iterations", "5", "--json", "--timeout-s", "200",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_report(report)
    assert report["profiling"]["iterations"] > 0
    exported = run_ctl(
        daemon.dirs.runtime_dir, "profile", "export", report["job"], "-o", str(tmp_path / "measured.csv")
    )
    assert exported.returncode == 0, exported.stderr
    measured = read_profile(tmp_path / "measured.csv")
    split = {Instruction.FORWARD, Instruction.BACKWARD_INPUT, Instruction.BACKWARD_WEIGHT}
    assert {(m.stage, m.instruction) for m in measured.measurements} == {
        (s, i) for s in range(4) for i in split
    }
    clocks = _plan_clocks(daemon, report["job"])
    assert len(clocks["backward_weight"]) == len(clocks["backward_input"]) == 2 * 2 * 4


def test_an_imported_zero_bubble_profile_runs_the_weight_gradients_at_lower_clocks(
    daemon: DaemonProcess,
) -> None:
    """zbv with the board's own costs imported (its backwards split in halves): the running plan gives the
    weight gradients, which nothing waits for but the iteration's end, lower clocks than the input gradients
    (the planner's tests show it stage by stage)."""
    out = run_emulate(
        daemon.dirs.runtime_dir,
        "--profile", "a100_sxm", "--stages", "2", "--microbatches", "4", "--schedule", "zbv", "--chunks", "2",
        "--time-scale", "0.25", "--iterations", "5", "--import-profile", "--json", "--timeout-s", "90",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_report(report)
    clocks = _plan_clocks(daemon, report["job"])
    assert sum(clocks["backward_weight"]) < sum(clocks["backward_input"])

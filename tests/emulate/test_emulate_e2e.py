"""perseus-emulate against a real perseusd on simulated GPUs: the baseline run, its measurements, the
dependencies between stage processes, usage errors, and what a killed emulator leaves behind."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perseusd.emulate.topology import PipelineShape
from perseusd.emulate.trace import read_trace
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.baselines import all_max
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import build_dag
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv
from tests.emulate.helpers import (
    computations,
    dependency_violations,
    emulate_command,
    exact_energy_j,
    order_violations,
    run_emulate,
)
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

GPUS = 4
MAX_CLOCK_MHZ = 1410
A100_BLOCKING_W = load_board("a100_sxm").blocking_power_w
TINY = ("--profile", "a100_sxm", "--stages", "2", "--microbatches", "4")
LEASE_GONE_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """One daemon for the module: 4 simulated A100s, the default 100 ms energy counter."""
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=GPUS).start()


@pytest.fixture(scope="module")
def baseline_run(daemon: DaemonProcess) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A baseline-only run of a tiny job with a trace: (its JSON, the trace records)."""
    trace = daemon.dirs.base / "baseline.jsonl"
    out = run_emulate(
        daemon.dirs.runtime_dir,
        *TINY,
        "--time-scale", "0.5", "--iterations", "6", "--baseline-only", "--json", "--trace", str(trace),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), read_trace(trace)


def _leases(daemon: DaemonProcess) -> list[Any]:
    return [gpu["lease"] for gpu in daemon.status()["gpus"] if gpu["lease"] is not None]


def _wait_no_leases(daemon: DaemonProcess) -> None:
    deadline_s = time.monotonic() + LEASE_GONE_TIMEOUT_S
    while _leases(daemon):
        assert time.monotonic() < deadline_s, f"leases left: {_leases(daemon)}"
        time.sleep(0.1)


def test_baseline_only_run_reports_the_baseline(
    baseline_run: tuple[dict[str, Any], list[dict[str, Any]]], daemon: DaemonProcess
) -> None:
    report, _ = baseline_run
    baseline = report["baseline"]
    assert baseline["iterations"] == 6
    assert baseline["iteration_time_s"] > 0
    assert baseline["energy_per_iteration_j"] > 0
    model = report["model_all_max"]
    # The emulation cannot run faster than the profile; messaging overhead makes it a little slower.
    assert baseline["iteration_time_s"] >= model["iteration_time_s"] * 0.99
    # Energy counted for both GPUs (not one, not twice): the profile's prediction within a loose bound.
    assert baseline["energy_per_iteration_j"] == pytest.approx(model["energy_per_iteration_j"], rel=0.2)
    assert report["optimized"] is None
    assert report["saving_pct"] is None
    assert report["profiling"] is None
    assert report["failure"] is None
    phases = [row["phase"] for row in report["iterations"]]
    assert phases[0] == "warmup"
    assert set(phases[1:]) == {"baseline"}
    assert len({gpu for pipeline in report["gpus"] for gpu in pipeline}) == 2
    assert _leases(daemon) == []


def test_stages_respect_dependencies_and_run_at_max_clock(
    baseline_run: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    runs = computations(baseline_run[1])
    shape = PipelineShape(2, 4, 1, "1f1b")
    assert len(runs) >= 7 * 2 * 8  # 7 iterations at least, 2 stages, 8 computations each
    assert dependency_violations(runs, shape) == []
    assert order_violations(runs, shape) == []
    assert {run["clock_mhz"] for run in runs} == {MAX_CLOCK_MHZ}


def test_counter_energy_is_within_one_percent_of_the_exact_energy(
    baseline_run: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    report, records = baseline_run
    (window,) = [record for record in records if record["kind"] == "window"]
    runs = computations(records)
    counted_j = exact_j = 0.0
    for gpu, end_j in window["end"]["energy_j"].items():
        start_s, end_s = window["start"]["time_s"][gpu], window["end"]["time_s"][gpu]
        counted_j += end_j - window["start"]["energy_j"][gpu]
        exact_j += exact_energy_j(runs, gpu, start_s, end_s, A100_BLOCKING_W)
    assert counted_j == pytest.approx(exact_j, rel=0.01)
    assert report["baseline"]["energy_j"] == pytest.approx(counted_j)


def test_interleaved_pipelines_respect_the_ring_dependencies(daemon: DaemonProcess) -> None:
    trace = daemon.dirs.base / "interleaved.jsonl"
    out = run_emulate(
        daemon.dirs.runtime_dir,
        *TINY,
        "--pipelines", "2", "--schedule", "interleaved", "--chunks", "2", "--time-scale", "0.2",
        "--iterations", "2", "--baseline-only", "--json", "--trace", str(trace),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["baseline"]["pipeline_iteration_times_s"]) == 2
    runs = computations(read_trace(trace))
    shape = PipelineShape(2, 4, 2, "interleaved")
    assert {run["pipeline"] for run in runs} == {0, 1}
    assert {run["profile_stage"] for run in runs} == {0, 1, 2, 3}
    assert dependency_violations(runs, shape) == []
    assert order_violations(runs, shape) == []


def test_a_zero_bubble_v_runs_its_split_backwards_where_the_data_flows(daemon: DaemonProcess) -> None:
    """zbv: chunk 0 goes down the stages and chunk 1 back up (model stage 2 S - 1 - s); input gradients flow
    back the same way, and each weight gradient runs after its own input gradient, waiting for nothing
    else."""
    trace = daemon.dirs.base / "zbv.jsonl"
    out = run_emulate(
        daemon.dirs.runtime_dir,
        *TINY,
        "--schedule", "zbv", "--chunks", "2", "--time-scale", "0.2",
        "--iterations", "2", "--baseline-only", "--json", "--trace", str(trace),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    runs = computations(read_trace(trace))
    assert {run["instruction"] for run in runs} == {"forward", "backward_input", "backward_weight"}
    assert order_violations(runs, PipelineShape(2, 4, 2, "zbv")) == []
    ends = {
        (r["iteration"], r["instruction"], r["microbatch"], r["stage"], r["chunk"]): r["end_s"] for r in runs
    }

    def model_stage(stage: int, chunk: int) -> int:
        return stage if chunk == 0 else 3 - stage

    at = {model_stage(s, c): (s, c) for s in (0, 1) for c in (0, 1)}
    for r in runs:
        v = model_stage(r["stage"], r["chunk"])
        if r["instruction"] == "forward" and v > 0:
            waits = (r["instruction"], *at[v - 1])
        elif r["instruction"] == "backward_input" and v < 3:
            waits = (r["instruction"], *at[v + 1])
        elif r["instruction"] == "backward_weight":
            waits = ("backward_input", r["stage"], r["chunk"])
        else:
            continue
        before = ends[(r["iteration"], waits[0], r["microbatch"], waits[1], waits[2])]
        assert r["start_s"] >= before, (r, waits)


def _off_board_csv(tmp_path: Path) -> Path:
    """The A100 profile with one row moved to 1000 MHz, a clock the A100 board does not have."""
    lines = profile_to_csv(bundled_profile("a100_sxm")).splitlines()
    stage, instruction, _freq, time_s, energy_j = lines[1].split(",")
    lines[1] = ",".join((stage, instruction, "1000", time_s, energy_j))
    path = tmp_path / "off-board.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--profile", "a100_sxm", "--stages", "5", "--microbatches", "4"), "--sim-gpus 5"),
        (
            ("--profile", "a40", "--stages", "2", "--microbatches", "4"),
            "a100_sxm board does not support: 1425,",
        ),
        ((*TINY, "--schedule", "zigzag"), "invalid choice"),
        ((*TINY, "--schedule", "interleaved"), "--chunks 2"),
        ((*TINY, "--time-scale", "0"), "positive"),
        (
            ("--profile", "OFF_BOARD", "--stages", "2", "--microbatches", "4"),
            "1000 MHz (the board supports 855-1410",
        ),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(
    daemon: DaemonProcess, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    args = tuple(str(_off_board_csv(tmp_path)) if arg == "OFF_BOARD" else arg for arg in args)
    out = run_emulate(daemon.dirs.runtime_dir, *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert _leases(daemon) == []


def test_a_profile_of_ones_own_runs_at_its_own_costs(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Any profile the board supports runs: the stages draw its costs, not the bundled profile's. The
    profile takes 1.5 x the bundled one's time and energy, at the same power (at most 481 W: nothing is
    capped at the A100 board's 500 W default limit)."""
    bundled = bundled_profile("a100_sxm")
    hungrier = Profile.from_measurements(
        (replace(m, time_s=m.time_s * 1.5, energy_j=m.energy_j * 1.5) for m in bundled.measurements),
        source="hungrier.csv",
    )
    path = tmp_path / "hungrier.csv"
    path.write_text(profile_to_csv(hungrier))
    out = run_emulate(
        daemon.dirs.runtime_dir,
        "--profile", str(path), "--stages", "2", "--microbatches", "4",
        "--time-scale", "0.5", "--iterations", "6", "--baseline-only", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["profile"].endswith("hungrier.csv")
    predicted_j = report["model_all_max"]["energy_per_iteration_j"]
    measured_j = report["baseline"]["energy_per_iteration_j"]
    assert measured_j == pytest.approx(predicted_j, rel=0.2)
    assert measured_j > 1.2 * _baseline_prediction_j(bundled)


def _baseline_prediction_j(profile: Profile) -> float:
    dag = build_dag("1f1b", 2, 4, 1)
    return all_max(dag, profile.scaled(0.5, 0.5), A100_BLOCKING_W).energy_j


def test_no_daemon_is_a_usage_error(tmp_path: Path) -> None:
    out = run_emulate(tmp_path, *TINY)
    assert out.returncode == 2
    assert "no perseusd" in out.stderr
    assert "--backend sim" in out.stderr


def _start_long_run(daemon: DaemonProcess) -> subprocess.Popen[str]:
    """An emulator that trains for long; returns once it printed its first measured iteration."""
    proc = subprocess.Popen(
        emulate_command(
            daemon.dirs.runtime_dir, *TINY, "--time-scale", "0.2", "--iterations", "1000", "--baseline-only"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.split()[:2] == ["1", "baseline"]:
            break
    else:
        proc.kill()
        pytest.fail(f"the emulator never trained: {proc.communicate(timeout=10)}")
    assert len(_leases(daemon)) == 2
    return proc


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stopped_emulator_leaves_no_lease(daemon: DaemonProcess, signum: int) -> None:
    proc = _start_long_run(daemon)
    stage_pids = [lease["pid"] for lease in _leases(daemon)]
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()  # never left behind: its pipes and process go with the failure
        out, err = proc.communicate(timeout=10)
        name = signal.Signals(signum).name
        pytest.fail(f"the emulator outlived {name} by 30 s: {out[-2000:]} {err[-2000:]}")
    if signum != signal.SIGKILL:
        assert proc.returncode == 1
        assert "interrupted" in err
    _wait_no_leases(daemon)
    deadline_s = time.monotonic() + LEASE_GONE_TIMEOUT_S
    while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in stage_pids):
        assert time.monotonic() < deadline_s, "stage processes outlived the emulator"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_the_h100_board_runs_its_profile_and_refuses_clocks_it_lacks(tmp_path: Path) -> None:
    """`--sim-model h100_sxm`: the bundled H100 profile runs; a profile at 1000 MHz is refused."""
    with daemon_processes() as make:
        h100 = make(DaemonDirs.create(), gpus=2, extra_args=("--sim-model", "h100_sxm")).start()
        out = run_emulate(
            h100.dirs.runtime_dir,
            "--profile", "h100_sxm", "--stages", "2", "--microbatches", "4",
            "--iterations", "4", "--baseline-only", "--json",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["board"] == "h100_sxm"
        assert report["baseline"]["energy_per_iteration_j"] == pytest.approx(
            report["model_all_max"]["energy_per_iteration_j"], rel=0.2
        )
        off_board = str(_off_board_csv(tmp_path))
        refused = run_emulate(
            h100.dirs.runtime_dir, "--profile", off_board, "--stages", "2", "--microbatches", "4"
        )
        assert refused.returncode == 2
        assert "h100_sxm board does not support: 1000 MHz (the board supports 345-1980 MHz" in refused.stderr

"""A pipeline with one real stage (issue: a real stage of a real pipeline), without a GPU: a `--backend mixed`
daemon whose real GPU is a simulated stand-in, `perseus-emulate --real-stage`, and the pipeline built from the
real stage's own sweep (the H200's, recorded in docs/gpu-validate/)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.pipeline_check import recorded_sweep
from perseusd.emulate.hybrid import DEFAULT_WEIGHTS, critical_stage, pipeline_profile
from perseusd.emulate.trace import read_trace
from perseusd.planner.profile_csv import profile_to_csv
from tests.emulate.helpers import computations, run_emulate
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes


@pytest.fixture(scope="module")
def mixed() -> Iterator[DaemonProcess]:
    """A mixed daemon: a simulated H100 board standing in for the real GPU, three boards beside it."""
    args = ("--backend", "mixed", "--mixed-real", "sim", "--sim-model", "h100_sxm")
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=3, env={"PERSEUSD_SIM_UPDATE_PERIOD_S": "0.05"})
        daemon.extra_args = args  # after --backend sim: the later flag wins
        yield daemon.start()


def _profile(tmp_path: Path, real_stage: int) -> Path:
    path = tmp_path / f"hybrid-{real_stage}.csv"
    path.write_text(profile_to_csv(pipeline_profile(recorded_sweep(), real_stage)))
    return path


def test_the_pipeline_is_built_from_the_real_stages_sweep_with_stated_weights() -> None:
    sweep = recorded_sweep()
    profile = pipeline_profile(sweep, 3)
    top = max(sweep, key=lambda r: r.clock_mhz)
    real = profile.lookup(
        3, profile.options(3, profile.measurements[0].instruction)[0].instruction, top.clock_mhz
    )
    assert real.time_s == pytest.approx(top.forward_s)
    heavy = profile.lookup(1, real.instruction, top.clock_mhz)
    assert heavy.time_s == pytest.approx(top.forward_s * 1.25 / 0.9)
    assert heavy.energy_j / heavy.time_s == pytest.approx(real.energy_j / real.time_s)  # same power
    assert critical_stage(DEFAULT_WEIGHTS) == 1


def test_the_real_stage_gets_the_daemons_first_gpu_and_its_own_energy(
    mixed: DaemonProcess, tmp_path: Path
) -> None:
    first_gpu = mixed.status()["gpus"][0]["uuid"]
    out = run_emulate(
        mixed.dirs.runtime_dir,
        "--profile", str(_profile(tmp_path, 0)), "--stages", "4", "--microbatches", "4", "--real-stage", "0",
        "--time-scale", "0.5", "--iterations", "4", "--import-profile", "--json", "--timeout-s", "100",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    real = report["real_stage"]
    assert real["gpu"] == first_gpu == report["gpus"][0][0]
    assert real["simulated_stand_in"] is True
    assert real["baseline_energy_per_iteration_j"] > 0
    assert real["optimized_energy_per_iteration_j"] > 0
    per_gpu = report["optimized"]["gpu_energy_per_iteration_j"]
    assert sum(per_gpu.values()) == pytest.approx(report["optimized"]["energy_per_iteration_j"], rel=0.02)
    assert report["plan"]["state"] == "running"


def test_the_real_stages_layers_run_in_the_pipeline(mixed: DaemonProcess, tmp_path: Path) -> None:
    """Real layers (on the CPU here) in stage 1 of the pipeline: they wait for their neighbours' messages,
    compute, and report every computation; the trace says what ran them."""
    trace = tmp_path / "trace.jsonl"
    out = run_emulate(
        mixed.dirs.runtime_dir,
        "--profile", str(_profile(tmp_path, 1)), "--stages", "4", "--microbatches", "4", "--real-stage", "1",
        "--real-device", "cpu", "--real-layers", "1", "--real-d-model", "64", "--real-seq", "16",
        "--baseline-only", "--iterations", "3", "--json", "--trace", str(trace), "--timeout-s", "100",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = read_trace(trace)
    [executor] = [r for r in records if r["kind"] == "executor"]
    assert (executor["stage"], executor["executor"], executor["device"]) == (1, "torch", "cpu")
    real = [r for r in computations(records) if r["stage"] == 1]
    iterations = {r["iteration"] for r in real}
    assert len(real) == 8 * len(iterations)  # 4 forwards and 4 backwards every iteration
    upstream = {
        (r["iteration"], r["microbatch"]): r
        for r in computations(records)
        if r["stage"] == 0 and r["instruction"] == "forward"
    }
    for record in (r for r in real if r["instruction"] == "forward"):
        # a forward starts only once stage 0's forward of the same microbatch has ended
        assert record["start_s"] >= upstream[(record["iteration"], record["microbatch"])]["end_s"] - 1e-3


def test_a_real_stage_needs_a_free_first_gpu_and_real_time(mixed: DaemonProcess, tmp_path: Path) -> None:
    out = run_emulate(
        mixed.dirs.runtime_dir,
        "--profile", str(_profile(tmp_path, 0)), "--stages", "4", "--microbatches", "4", "--real-stage", "4",
    )  # fmt: skip
    assert out.returncode == 2
    assert "--real-stage 4 is not a stage" in out.stderr

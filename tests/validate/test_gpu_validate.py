"""`benchmarks/gpu_validate.py` without a GPU: arguments, the report's arithmetic, and the clear refusal.

The run itself (NVML, torch on CUDA, the daemon on `--backend nvml`) needs a real GPU and root: the last test
is marked `gpu` and runs the whole command there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from benchmarks.gpu_truth import (
    BoundaryRecorder,
    best_single_clock,
    job_truth,
    padded_energy_j,
    profile_error,
    sweep_at,
    target_row,
)
from benchmarks.gpu_validate import markdown, parse_args, refusal
from perseusd.emulate.hybrid import SweepRow

ROOT = Path(__file__).resolve().parents[2]
SWEEP = [
    SweepRow(1980, 0.010, 5.0, 0.020, 12.0),
    SweepRow(1500, 0.012, 4.5, 0.024, 10.8),
    SweepRow(1020, 0.016, 4.4, 0.032, 10.6),
]


def test_arguments_have_defaults_and_bad_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args([])
    assert (args.gpu, args.microbatches, args.sweep_clocks, args.out) == (0, 8, 10, None)
    for bad in (["--microbatches", "0"], ["--sweep-clocks", "2"], ["--layers", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "must be >= " in capsys.readouterr().err


def test_sweep_is_interpolated_between_swept_clocks_only() -> None:
    middle = sweep_at(SWEEP, 1740)
    assert middle is not None
    assert middle.forward_s == pytest.approx(0.011)
    assert middle.backward_j == pytest.approx(11.4)
    assert sweep_at(SWEEP, 1980) == SWEEP[0]
    assert sweep_at(SWEEP, 900) is None


def test_profile_error_compares_each_row_with_the_sweep() -> None:
    csv = "stage,instruction,frequency,time,energy\n0,forward,1980,0.0101,5.1\n0,backward,1500,0.024,10.0\n"
    csv += "0,forward,900,0.02,4.9\n"
    error = profile_error(csv, SWEEP)
    assert [r.get("outside_sweep") for r in error["rows"]] == [None, None, True]
    assert error["rows"][0]["time_err"] == pytest.approx(0.01)
    assert error["rows"][1]["energy_err"] == pytest.approx(10.0 / 10.8 - 1, abs=1e-4)
    assert error["worst_energy_err"] == pytest.approx(0.0741, abs=1e-4)
    assert error["within_bounds"] is False  # backward at 1500 is 7.4 % low
    assert profile_error("stage,instruction,frequency,time,energy\n", SWEEP)["within_bounds"] is False


def test_targets_are_compared_with_all_max_padded_at_idle_power() -> None:
    assert padded_energy_j(100.0, 0.5, 120.0, 0.6) == pytest.approx(112.0)
    assert padded_energy_j(100.0, 0.5, 120.0, 0.4) == 100.0  # never below all-max
    # All-max 0.3 s: 1.15x allows 0.345 s; 1500 MHz takes 0.36 s (too slow), so 1980 is the only fit.
    assert best_single_clock(SWEEP, 0.3, 0.345) == 1980
    assert best_single_clock(SWEEP, 0.3, 0.5) == 1020  # every clock fits: the least energy
    assert best_single_clock(SWEEP, 0.3, 0.2) is None
    all_max = {"time_s": 0.5, "energy_j": 100.0}
    single = {"clock_mhz": 1500.0, "time_s": 0.6, "energy_j": 100.0}
    row = target_row(1.15, {"time_s": 0.57, "energy_j": 95.0}, all_max, 120.0, single)
    assert row["all_max_padded_j"] == pytest.approx(108.4)
    assert row["saving_pct"] == pytest.approx(12.36, abs=0.01)
    assert row["single_clock"]["saving_pct"] == pytest.approx(10.71, abs=0.01)
    assert row["of_single_clock_saving"] == pytest.approx(1.154, abs=0.001)
    assert target_row(1.0, {"time_s": 0.5, "energy_j": 90.0}, all_max, 120.0, None)["single_clock"] is None


def test_the_report_renders_as_a_markdown_section_for_the_docs() -> None:
    all_max = {"time_s": 0.5, "energy_j": 100.0, "idle_w": 120.0}
    single = {"clock_mhz": 1500.0, "time_s": 0.6, "energy_j": 100.0}
    report = {
        "ok": True,
        "args": {"layers": "4", "d_model": "4096", "microbatches": "8", "seq": "2048"},
        "probe": {"info": {"name": "NVIDIA H100 80GB HBM3", "supported_sm_clocks_mhz": [1980, 1965, 345]}},
        "all_max": all_max,
        "closed_loop": {"state": "running", "error": None, "profiling_iterations": 44},
        "profile_error": {"worst_time_err": 0.004, "worst_energy_err": 0.021, "within_bounds": True},
        "targets": [target_row(1.15, {"time_s": 0.57, "energy_j": 95.0}, all_max, 120.0, single)],
    }
    text = markdown(report)
    assert text.startswith("### Measured on a real GPU")
    assert "NVIDIA H100 80GB HBM3, 3 SM clocks (345-1980 MHz)" in text
    assert "Online profiling: 44 iterations, job state `running`." in text
    assert "worst energy error 2.1 % (bounds 2 % and 3 %: met)" in text
    assert "| 1.15 | 0.57 | 95.0 | 108.4 | 12.36 % | 1500 MHz | 10.71 % | 1.15 |" in text
    assert "did not complete" not in text
    failed = markdown({"ok": False, "closed_loop": {"state": "failed", "error": "energy does not move"}})
    assert "job state `failed` (energy does not move)" in failed
    assert "did not complete" in failed
    assert markdown({"ok": False, "refused": "needs root"}).endswith("Refused: needs root\n")


@pytest.mark.skipif(refusal() is None, reason="this machine can run the real check")
def test_without_a_gpu_or_root_it_refuses_clearly(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_validate.py"),
            "--out",
            str(out),
            "--markdown",
            str(tmp_path / "report.md"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["refused"] == refusal()
    assert json.loads(out.read_text()) == report
    assert (tmp_path / "report.md").read_text().endswith(f"Refused: {refusal()}\n")


def test_the_recorder_times_a_real_schedules_computations(tmp_path: Path) -> None:
    """The ground truth's timing path on CPU: a real torch.distributed.pipelining 1F1B schedule,
    instrumented with the recorder standing in for the client (on CPU the boundaries arrive directly)."""
    import torch
    import torch.distributed as dist
    from perseus_client.client import PerseusClient
    from perseus_client.torch_pipelining import instrument
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        stage = PipelineStage(nn.Sequential(nn.Linear(64, 64), nn.ReLU()), 0, 1, torch.device("cpu"))
        schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, y: (out - y).square().mean())
        recorder = BoundaryRecorder()
        handle = instrument(schedule, cast(PerseusClient, recorder), "GPU-0", register=False)
        try:
            for _ in range(3):
                schedule.step(torch.randn(8, 64), target=torch.zeros(8, 64))
        finally:
            handle.close()
    finally:
        dist.destroy_process_group()
    assert {k: len(v) for k, v in recorder.durations_s.items()} == {"forward": 12, "backward": 12}
    for instruction in ("forward", "backward"):
        assert 0 < recorder.mean_s(instruction) < 1.0
    with pytest.raises(ValueError, match="no optimizer"):
        recorder.mean_s("optimizer")


def test_the_middle_90_percent_of_durations_is_averaged() -> None:
    recorder = BoundaryRecorder()
    recorder.durations_s["forward"] = [0.010] * 19 + [1.0] + [0.0]
    assert recorder.mean_s("forward") == pytest.approx(0.010)


def test_job_truth_splits_the_pairs_energy_by_the_standalone_powers() -> None:
    standalone = SweepRow(1500, 0.010, 4.0, 0.020, 10.0)  # 400 W forward, 500 W backward
    iteration = {"time_s": 8 * 0.032 + 0.004, "energy_j": 8 * 14.0 + 0.004 * 100.0}
    row = job_truth(standalone, 0.011, 0.021, iteration, idle_w=100.0, microbatches=8)
    assert (row.clock_mhz, row.forward_s, row.backward_s) == (1500, 0.011, 0.021)
    assert row.forward_j + row.backward_j == pytest.approx(14.0)
    assert row.forward_j / row.backward_j == pytest.approx((400 * 0.011) / (500 * 0.021))


@pytest.mark.gpu
@pytest.mark.skipif(os.geteuid() != 0 or refusal() is not None, reason="needs an NVIDIA GPU and root")
def test_the_whole_check_on_a_real_gpu(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_validate.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["closed_loop"]["state"] == "running"
    assert report["closed_loop"]["profiling_iterations"] <= 80
    assert [t["factor"] for t in report["targets"]] == [1.0, 1.15, 1.3]

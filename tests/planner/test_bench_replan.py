"""`benchmarks/replan_measured.py`: a closed-loop run's online profile planned again offline, and both plans
judged on the board's true costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.replan_measured import board_profile, find_runs, main, replan
from perseusd.gpu.sim_boards import load_board

CASE = "dense4x8"
SWEEP_MHZ = (1980, 1725, 1470, 1215, 960)


def _write_run(folder: Path, plan_mhz: int, seed: int = 0, latency_ms: float = 12.5) -> Path:
    """A run as `bench_closed_loop.py --trace-dir` keeps it: the board's costs at a sweep's clocks as the
    measured profile (waiting powers the board's), every computation at `plan_mhz` as the deployed plan, and
    a log line with the lock latency."""
    board = load_board("h100_sxm")
    truth = board_profile(CASE, "h100_sxm")
    lines = ["stage,instruction,frequency,time,energy,waiting_power"]
    waits_told: set[int] = set()
    for m in truth.measurements:
        if m.freq_mhz in SWEEP_MHZ:
            waiting = "" if m.freq_mhz in waits_told else repr(board.idle_power_w(m.freq_mhz))
            waits_told.add(m.freq_mhz)
            lines.append(
                f"{m.stage},{m.instruction.value},{m.freq_mhz},{m.time_s!r},{m.energy_j!r},{waiting}"
            )
    profile = folder / f"family_{CASE}-seed{seed}.profile.csv"
    profile.write_text("\n".join(lines) + "\n")
    stages = sorted({m.stage for m in truth.measurements})
    rows = [[{"freq_mhz": plan_mhz}] * 16 for _ in stages]  # 8 forwards and 8 backwards a stage
    profile.with_suffix(".plan.json").write_text(json.dumps({"stages": rows}))
    log = folder / f"family_{CASE}-seed{seed}.daemon.log"
    log.write_text(
        f"INFO perseusd.jobs.solve_dispatch: job x: solving for a {latency_ms} ms clock-set latency\n"
    )
    return profile


def test_all_max_deployed_saves_nothing_and_the_replanned_profile_saves_on_the_board(tmp_path: Path) -> None:
    _write_run(tmp_path, plan_mhz=1980)
    runs = find_runs([tmp_path])
    assert [(r.case, r.seed) for r in runs] == [(CASE, 0)]
    result = replan(runs[0], "h100_sxm")
    assert result["latency_ms"] == 12.5
    assert result["deployed_pct"] == pytest.approx(0.0, abs=1e-9)
    assert result["deployed_slowdown_pct"] == pytest.approx(0.0, abs=1e-9)
    assert result["replanned_pct"] > 5.0  # the sweep's clocks, exact: the planner saves on the board
    assert result["replanned_slowdown_pct"] < 1.0


def test_a_lower_deployed_plan_is_judged_slower(tmp_path: Path) -> None:
    _write_run(tmp_path, plan_mhz=1215)
    result = replan(find_runs([tmp_path])[0], "h100_sxm")
    assert result["deployed_slowdown_pct"] > 10.0


def test_a_folder_without_runs_or_a_run_without_its_log_is_said(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 2
    _write_run(tmp_path, plan_mhz=1980)
    (tmp_path / f"family_{CASE}-seed0.daemon.log").unlink()
    assert find_runs([tmp_path]) == []

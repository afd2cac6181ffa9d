"""`benchmarks/bench_power_swings.py` runs its four arms on a short, small fleet, and its ramp-bounded arms
hold their bound at every 10 ms sample of the node's held power (pure computation: no timing in it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_every_arm_reports_and_the_ramp_bound_holds_at_every_sample() -> None:
    command = [sys.executable, str(ROOT / "benchmarks/bench_power_swings.py"), "--pipelines", "2"]
    command += ["--stages", "4", "--microbatches", "4", "--seconds", "5", "--ramp-bound-w-per-s", "30000"]
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    arms = out["arms"]
    assert {"all_max", "plans", "uniform_limit", "plans_ramp_bounded"} <= set(arms)
    (bounded,) = arms["plans_ramp_bounded"]
    plans = arms["plans"]
    assert plans["node"]["held_max_ramp_10ms_w_per_s"] > 0
    assert bounded["ramp_bound_w_per_s"] == 30000
    assert bounded["met"]
    assert bounded["computations_raised"] > 0  # the plan did not hold it alone
    assert bounded["violations"] == 0
    assert bounded["samples"] == 499
    assert bounded["node"]["held_max_ramp_10ms_w_per_s"] <= 30000
    assert bounded["iteration_s"] <= plans["iteration_s"]
    assert bounded["saving_cost_pts"] == pytest.approx(plans["saving_pct"] - bounded["saving_pct"], abs=0.02)

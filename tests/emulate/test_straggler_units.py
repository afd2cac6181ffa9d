"""Unit tests of the emulator's several-daemon and straggler parts: layout, combined job state, throttling."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from perseus_client.protocol import JobInfo

from perseusd.emulate.daemons import combined_state, summary_job
from perseusd.emulate.phases import PhaseConfig, PhaseMachine
from perseusd.emulate.preflight import counter_key, daemon_of
from perseusd.emulate.straggler import StragglerSpec, ThrottleSchedule, parse_straggler
from tests.support.job_info import BARE_JOB


def test_pipelines_go_to_the_daemons_in_contiguous_blocks() -> None:
    assert [daemon_of(p, 4, 2) for p in range(4)] == [0, 0, 1, 1]
    assert [daemon_of(p, 3, 2) for p in range(3)] == [0, 0, 1]
    assert [daemon_of(p, 2, 1) for p in range(2)] == [0, 0]
    assert counter_key(0, "GPU-x", 1) == "GPU-x"
    assert counter_key(1, "GPU-x", 2) == "d1/GPU-x"


def test_straggler_argument() -> None:
    assert parse_straggler("0:1.2") == StragglerSpec(0, 1.2, 0, None)
    assert parse_straggler("3:1.5:4:20") == StragglerSpec(3, 1.5, 4, 20)
    for bad in ("0", "0:0.9", "0:nan", "0:inf", "-1:1.2", "0:1.2:-1", "0:1.2:3:3", "0:1.2:1:2:3", "a:1.2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_straggler(bad)


def test_throttle_covers_the_baseline_and_the_closed_loop_window_only() -> None:
    schedule = ThrottleSchedule(1.5, warmup_iterations=1, from_iterations=2, to_iterations=5)
    assert [schedule.factor_at(k) for k in range(4)] == [1.0, 1.5, 1.5, 1.5]  # warm-up, then the baseline
    schedule.registered(4)
    assert [schedule.factor_at(k) for k in range(4, 10)] == [1.0] * 6  # profiling and solving: healthy
    schedule.running(10)
    assert [schedule.factor_at(k) for k in range(10, 17)] == [1.0, 1.0, 1.5, 1.5, 1.5, 1.0, 1.0]
    healthy = ThrottleSchedule(1.0, warmup_iterations=1)
    assert {healthy.factor_at(k) for k in range(5)} == {1.0}


def _job(state: str, error: str = "") -> JobInfo:
    return dataclasses.replace(BARE_JOB, job="j", state=state, error=error)


def test_the_job_state_over_daemons() -> None:
    assert combined_state([_job("running"), _job("running")]) == ("running", "")
    assert combined_state([_job("running"), _job("solving")]) == ("solving", "")
    assert combined_state([_job("profiling"), _job("solving")]) == ("profiling", "")
    assert combined_state([_job("running"), None]) == (None, "")
    assert combined_state([None, _job("failed", "no profile")]) == ("failed", "no profile")
    summary = summary_job([_job("running"), _job("solving")])
    assert summary is not None
    assert summary.state == "solving"
    assert summary_job([None, None]) is None


def test_settle_iterations_delay_the_optimized_window() -> None:
    config = PhaseConfig(
        baseline_iterations=1, iterations=2, max_profiling_iterations=50, settle_iterations=5
    )
    machine = PhaseMachine(config)
    machine.on_iteration(0, None)
    machine.on_iteration(1, None)
    assert machine.on_iteration(2, None).command == "register"
    machine.registered(3)
    for k in range(3, 12):
        machine.on_iteration(k, "running" if k >= 6 else "solving")
    assert machine.running_at == 6
    assert machine.on_iteration(13, "running").command == "stop"
    assert machine.windows["optimized"] == (11, 13)

"""A job whose measurements cannot support a plan is never deployed, and says why."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from perseus_client.protocol import (
    ComputationBegin,
    ComputationEnd,
    JobInfo,
    Register,
    RegisterOk,
    StepBegin,
    StepEnd,
)

from perseusd.daemon.core import DaemonCore
from perseusd.jobs.settings import JobSettings
from perseusd.planner.schedule_orders import one_f_one_b_order
from perseusd.profiling.sweep import SweepSettings
from tests.support.callers import ME
from tests.support.daemon_core import claim, core_jobs, sim_core

pytestmark = pytest.mark.timeout(120)

MICROBATCHES = 2
SETTINGS = JobSettings(
    warmup_iterations=0,
    max_profiling_iterations=12,
    sweep=SweepSettings(
        clock_stride=20,
        min_computations=1,
        max_iterations_per_clock=2,
        hard_max_iterations_per_clock=2,
        min_windows_per_clock=1,
    ),
)


def _job(core: DaemonCore) -> JobInfo:
    [job] = core_jobs(core)
    return job


def _iteration(core: DaemonCore, gpu: str, step: int) -> None:
    """One iteration of CPU-only "computations" (3 ms each): nothing drives the simulated GPU."""
    core.on_event(ME, StepBegin(gpu, step, time.monotonic_ns()))
    for instruction, microbatch, chunk in one_f_one_b_order(1, MICROBATCHES, 0):
        args = (gpu, 0, instruction.value, microbatch, chunk)
        core.on_event(ME, ComputationBegin(*args, time.monotonic_ns()))  # type: ignore[arg-type]
        time.sleep(0.003)
        core.on_event(ME, ComputationEnd(*args, time.monotonic_ns()))  # type: ignore[arg-type]
    core.on_event(ME, StepEnd(gpu, step, time.monotonic_ns()))
    core.tick()
    deadline_s = time.monotonic() + 5.0  # the next iteration's profiling clock is applied before it begins
    while not core.registry.stats()[gpu].get("set_locked_sm_clock_mhz") and time.monotonic() < deadline_s:
        time.sleep(0.001)
    time.sleep(0.002)


def test_a_job_no_workload_drives_is_not_deployed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="perseusd.jobs.manager")
    with sim_core(tmp_path, gpus=1, jobs=SETTINGS) as core:
        gpu = core.registry.uuids[0]
        claim(core, ME, (gpu,), "idle")
        reply = core.handle(ME, Register(gpu, "idle", 0, 0, 1, MICROBATCHES, "1f1b", 1))  # type: ignore[arg-type]
        assert isinstance(reply, RegisterOk)
        for step in range(60):
            _iteration(core, gpu, step)
            if _job(core).state not in ("registered", "profiling"):
                break
        job = _job(core)
        assert job.state == "failed", job
        assert job.plan_index is None
        assert core.plans.get(gpu) is None  # no plan deployed
        assert job.error.startswith("no plan: the measurements cannot support one: ")
        assert "does a workload drive these GPUs" in job.error or "do not follow" in job.error
        assert any(job.error.split(": ")[-1] in record.getMessage() for record in caplog.records)

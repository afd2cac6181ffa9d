"""Do no harm in the daemon: under `no_slowdown` a stage whose plan would not measurably save runs its safe
clock throughout (the plan the GPU gets, `perseusctl plan` and `jobs` agree); a stage with real slack keeps
its plan; other policies are left alone."""

from __future__ import annotations

import json
from pathlib import Path

from perseus_client.codes import JobState
from perseus_client.protocol import (
    DocumentReply,
    PlanRequest,
    ProfileImport,
    Register,
    SetPolicy,
)

from perseusd.daemon.core import DaemonCore
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.callers import ME
from tests.support.daemon_core import RUNNING_TIMEOUT_S, claim, core_job, sim_core, tick_until

# An H200-like stage (its measured sweep, rounded): 1980 and 1770 take the same time, 1770 for less energy.
ROWS = {
    1980: (0.0065, 4.40, 0.0143, 9.87),
    1770: (0.0065, 4.30, 0.0143, 9.60),
    1560: (0.0072, 4.20, 0.0158, 9.30),
    1350: (0.0082, 4.05, 0.0180, 8.90),
    1140: (0.0097, 4.00, 0.0212, 8.80),
}


def _profile(weights: tuple[float, ...]) -> str:
    rows = []
    for stage, weight in enumerate(weights):
        for clock, (f_s, f_j, b_s, b_j) in ROWS.items():
            rows.append(Measurement(stage, Instruction.FORWARD, clock, f_s * weight, f_j * weight))
            rows.append(Measurement(stage, Instruction.BACKWARD, clock, b_s * weight, b_j * weight))
    return profile_to_csv(Profile.from_measurements(rows, "h200-like"))


def _run_job(core: DaemonCore, weights: tuple[float, ...], microbatches: int) -> None:
    stages = len(weights)
    claim(core, ME, core.registry.uuids[:stages], "train")
    core.handle(ME, ProfileImport("train", _profile(weights), "h200-like.csv", 130.0))
    for stage in range(stages):
        gpu = core.registry.uuids[stage]
        core.handle(ME, Register(gpu, "train", 0, stage, stages, microbatches, "1f1b", 1))
    tick_until(core, lambda: core_job(core).state == JobState.RUNNING, RUNNING_TIMEOUT_S, "the job never ran")


def _plan_rows(core: DaemonCore) -> list[list[int]]:
    reply = core.handle(ME, PlanRequest(job="train"))
    assert isinstance(reply, DocumentReply)
    return [[entry["freq_mhz"] for entry in stage] for stage in json.loads(reply.document)["stages"]]


def test_a_one_stage_job_runs_its_safe_clock_and_says_why(tmp_path: Path) -> None:
    with sim_core(tmp_path, 1, model="h100_sxm") as core:
        _run_job(core, (1.0,), 4)
        job = core_job(core)
        assert "stage 0 runs 1770 MHz throughout" in job.plan_note
        assert _plan_rows(core) == [[1770] * 8]
        assert job.plan_energy_j < job.all_max_energy_j  # the capped plateau still saves


def test_the_stage_with_slack_keeps_its_plan_and_the_critical_one_runs_one_clock(tmp_path: Path) -> None:
    with sim_core(tmp_path, 2, model="h100_sxm") as core:
        _run_job(core, (0.7, 1.0), 8)  # stage 0 waits for stage 1: slack to lower its clocks
        job = core_job(core)
        assert "stage 1 runs" in job.plan_note
        assert "stage 0" not in job.plan_note
        rows = _plan_rows(core)
        assert len(set(rows[1])) == 1  # the critical stage: one clock
        assert min(rows[0]) < 1770  # the light stage: lowered where it has slack


def test_other_policies_run_the_point_as_solved(tmp_path: Path) -> None:
    with sim_core(tmp_path, 1, model="h100_sxm") as core:
        _run_job(core, (1.0,), 4)
        core.handle(ME, SetPolicy(job="train", policy="min_energy", target=0.0))
        core.tick()
        assert core_job(core).plan_note == ""
        assert min(_plan_rows(core)[0]) < 1770

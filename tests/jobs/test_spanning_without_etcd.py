"""Layouts on one daemon without a cluster plane: a pipeline whose other stages run elsewhere is not planned
(it waits and says why), and a stage of several tensor-parallel GPUs is one stage (its GPUs registered
together, profiled on one lead's clocks, no more GPUs than it declared)."""

from __future__ import annotations

from pathlib import Path

import pytest
from perseus_client.protocol import (
    JobInfo,
    ProfileImport,
    ProtocolError,
    Register,
    RegisterOk,
)

from perseusd.daemon.core import DaemonCore
from perseusd.gpu.sim_shared import StateMap, state_path
from perseusd.jobs.settings import JobSettings
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.callers import ME
from tests.support.daemon_core import core_jobs, sim_core_fixture
from tests.support.polling import wait_until
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

pytestmark = pytest.mark.timeout(120)


core = sim_core_fixture(4, jobs=JobSettings(), claimed_by="train")


def _register(core: DaemonCore, gpu: int, stage: int, stages: int, stage_gpus: int = 1) -> RegisterOk:
    message = Register(core.registry.uuids[gpu], "train", 0, stage, stages, 4, "1f1b", 1, stage_gpus, "")
    reply = core.handle(ME, message)
    assert isinstance(reply, RegisterOk)
    return reply


def _job(core: DaemonCore) -> JobInfo:
    core.tick()
    (job,) = core_jobs(core)
    return job


def _locked_mhz(tmp_path: Path, core: DaemonCore, gpu: int) -> int | None:
    state = StateMap(state_path(tmp_path / "sim", core.registry.uuids[gpu]), writable=False)
    try:
        return state.read_control().locked_sm_clock_mhz
    finally:
        state.close()


def test_a_pipeline_whose_other_stages_run_on_other_nodes_waits_and_says_it_needs_etcd(
    core: DaemonCore,
) -> None:
    assert _register(core, 0, stage=2, stages=4).state == "registered"
    _register(core, 1, stage=3, stages=4)
    job = _job(core)
    assert job.state == "registered"
    assert job.span is None
    assert job.error.startswith(
        "waiting for every stage of a pipeline (pipeline 0: 2 GPU(s); 4 per pipeline)"
    )
    assert "needs the cluster plane (etcd_endpoints" in job.error
    # The stages that were elsewhere register here after all: the job runs, the message is gone.
    core.handle(ME, ProfileImport("train", profile_to_csv(synthetic_profile(4, seed=3)), "s.csv", 80.0))
    _register(core, 2, stage=0, stages=4)
    _register(core, 3, stage=1, stages=4)
    assert _job(core).error == ""


def test_the_gpus_of_a_tensor_parallel_stage_are_one_stage(core: DaemonCore, tmp_path: Path) -> None:
    _register(core, 0, stage=0, stages=2, stage_gpus=2)
    _register(core, 1, stage=0, stages=2, stage_gpus=2)
    with pytest.raises(ProtocolError, match="2 GPU\\(s\\) per stage"):
        _register(core, 2, stage=0, stages=2, stage_gpus=2)
    _register(core, 2, stage=1, stages=2, stage_gpus=2)
    assert "4 per pipeline" in _job(core).error  # stage 1 has one of its two GPUs
    _register(core, 3, stage=1, stages=2, stage_gpus=2)
    job = _job(core)
    assert (job.state, job.stage_gpus, job.error) == ("profiling", 2, "")
    (pipeline,) = job.pipelines
    assert pipeline.stages_registered == 4  # GPUs
    # Each stage's second GPU was set its lead's clock (the sweep's first: the highest).
    # Each GPU's owner thread sets its clock on its own: wait for all four, leads and followers.
    clocked = lambda: all(_locked_mhz(tmp_path, core, gpu) is not None for gpu in range(4))  # noqa: E731
    wait_until(clocked, 10, "every GPU of each stage to get a clock", poll_s=0.02)
    assert _locked_mhz(tmp_path, core, 1) == _locked_mhz(tmp_path, core, 0) == max(A100_CLOCKS_MHZ)
    assert _locked_mhz(tmp_path, core, 3) == _locked_mhz(tmp_path, core, 2)
    with pytest.raises(ProtocolError, match="is run ''"):
        core.handle(ME, Register(core.registry.uuids[3], "train", 0, 1, 2, 4, "1f1b", 1, 2, "another"))

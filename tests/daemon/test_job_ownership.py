"""Another user's job is refused the same way by every request that names a job, and an unknown job the
same way by every request that reads one (docs/ctl.md, Who sees what)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from perseus_client.protocol import (
    AnnounceStraggler,
    ErrorCode,
    FrontierRequest,
    JobsReply,
    JobsRequest,
    Message,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    ProtocolError,
    Register,
    SetPolicy,
)

from perseusd.daemon.core import DaemonCore
from perseusd.jobs.settings import JobSettings
from perseusd.leasing.identity import Caller
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.callers import ME, OTHER
from tests.support.daemon_core import claim, sim_core
from tests.support.synthetic import synthetic_profile

pytestmark = pytest.mark.timeout(120)

STAGES = 2
CSV = profile_to_csv(synthetic_profile(STAGES, seed=3, clocks_mhz=tuple(range(1410, 850, -45))))


def naming(job: str, gpu: str) -> dict[str, Message]:
    """Every job request that names a job, for `job` (a register for stage 0 on `gpu`)."""
    return {
        "register": Register(gpu, job, 0, 0, STAGES, 4, "1f1b", 1),
        "set_policy": SetPolicy(job, "fastest", 0.0),
        "announce_straggler": AnnounceStraggler(job, 0, 1.2, False),
        "frontier": FrontierRequest(job),
        "plan": PlanRequest(job),
        "profile_export": ProfileExport(job),
        "profile_import": ProfileImport(job, CSV, "synthetic.csv", 80.0),
    }


@pytest.fixture
def core(tmp_path: Path) -> Iterator[DaemonCore]:
    """A core whose job `train` (2 stages) ME registered on GPUs 0 and 1; GPU 2 is free."""
    with sim_core(tmp_path, gpus=STAGES + 1, jobs=JobSettings()) as built:
        claim(built, ME, built.registry.uuids[:STAGES], "train")
        for stage in range(STAGES):
            gpu = built.registry.uuids[stage]
            built.handle(ME, Register(gpu, "train", 0, stage, STAGES, 4, "1f1b", 1))
        yield built


@pytest.fixture
def other(core: DaemonCore) -> Iterator[Caller]:
    """OTHER, a live process of another user holding GPU 2 (a register needs a lease)."""
    child = subprocess.Popen(["sleep", "120"])
    caller = replace(OTHER, pid=child.pid)
    try:
        claim(core, caller, (core.registry.uuids[STAGES],), "mine")
        yield caller
    finally:
        child.kill()
        child.wait()


def refusal(core: DaemonCore, caller: Caller, message: Message) -> ProtocolError:
    with pytest.raises(ProtocolError) as refused:
        core.handle(caller, message)
    return refused.value


def test_another_users_job_is_refused_alike_by_every_request(core: DaemonCore, other: Caller) -> None:
    gpu = core.registry.uuids[STAGES]
    refusals = {name: refusal(core, other, message) for name, message in naming("train", gpu).items()}
    assert {name: (r.code, r.message) for name, r in refusals.items()} == dict.fromkeys(
        refusals, (ErrorCode.PERMISSION_DENIED, "job 'train' belongs to another user")
    )
    listed = core.handle(other, JobsRequest())
    assert isinstance(listed, JobsReply)
    assert listed.jobs == ()  # nor does the list show it


def test_an_unknown_job_is_refused_alike_by_every_request_that_reads_one(core: DaemonCore) -> None:
    reads = {
        name: message
        for name, message in naming("nope", core.registry.uuids[0]).items()
        if name not in {"register", "profile_import"}  # these two start a job or keep its profile for it
    }
    refusals = {name: refusal(core, ME, message) for name, message in reads.items()}
    assert {name: (r.code, r.message) for name, r in refusals.items()} == dict.fromkeys(
        refusals, (ErrorCode.BAD_FIELD, "no job 'nope' on this node")
    )


def test_the_owner_is_not_refused(core: DaemonCore) -> None:
    """The same requests of the job's owner pass the ownership check (each fails later, or not at all)."""
    codes = {}
    for name, message in naming("train", core.registry.uuids[0]).items():
        try:
            core.handle(ME, message)
            codes[name] = None
        except ProtocolError as exc:
            codes[name] = exc.code
    assert ErrorCode.PERMISSION_DENIED not in codes.values(), codes
    assert codes["set_policy"] is None  # the owner's change is applied

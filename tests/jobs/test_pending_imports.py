"""Profiles imported before their job registers: one namespace per user (SO_PEERCRED uid) and a per-user cap,
so no user can replace, squat or drop another user's pending import."""

from __future__ import annotations

import os

import pytest
from perseus_client import protocol as p

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.requests.job import MAX_PENDING_IMPORTS_PER_USER
from perseusd.leasing.identity import Caller
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

pytestmark = pytest.mark.timeout(120)

STAGES, MICROBATCHES = 2, 4
VICTIM = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
ATTACKER = Caller(uid=os.getuid() + 1000, gid=os.getgid(), pid=os.getpid() + 1)


def _csv(seed: int) -> str:
    return profile_to_csv(synthetic_profile(STAGES, seed=seed, clocks_mhz=A100_CLOCKS_MHZ))


def _import(core: DaemonCore, caller: Caller, job: str, seed: int, p_block_w: float) -> p.ProfileImportOk:
    reply = core.handle(caller, p.ProfileImport(job, _csv(seed), f"seed{seed}.csv", p_block_w))
    assert isinstance(reply, p.ProfileImportOk)
    return reply


def _register_victim(core: DaemonCore, job: str) -> None:
    core.handle(VICTIM, p.Hello(job=job, client_version="test"))
    core.handle(VICTIM, p.Claim(gpus=core.registry.uuids, job=job))
    for stage, gpu in enumerate(core.registry.uuids):
        message = p.Register(gpu, job, 0, stage, STAGES, MICROBATCHES, "1f1b", 1)  # type: ignore[arg-type]
        assert isinstance(core.handle(VICTIM, message), p.RegisterOk)


def test_another_user_cannot_replace_a_pending_import(core: DaemonCore) -> None:
    assert _import(core, VICTIM, "train", seed=3, p_block_w=80.0).state == "pending"
    # The same job name from another user lands in that user's own namespace.
    assert _import(core, ATTACKER, "train", seed=9, p_block_w=55.0).state == "pending"
    _register_victim(core, "train")
    exported = core.handle(VICTIM, p.ProfileExport("train"))
    assert isinstance(exported, p.ProfileReply)
    assert exported.p_block_w == 80.0  # the victim's own profile, not the attacker's
    assert exported.csv == _csv(3)
    assert (ATTACKER.uid, "train") in core.jobs.pending_imports  # type: ignore[union-attr]


def test_per_user_cap_does_not_block_other_users(core: DaemonCore) -> None:
    _import(core, VICTIM, "train", seed=3, p_block_w=80.0)
    for index in range(MAX_PENDING_IMPORTS_PER_USER):
        _import(core, ATTACKER, f"squat-{index}", seed=4, p_block_w=50.0)
    with pytest.raises(p.ProtocolError) as refused:
        _import(core, ATTACKER, "one-more", seed=4, p_block_w=50.0)
    assert refused.value.code == p.ErrorCode.BAD_FIELD
    assert f"the most per user is {MAX_PENDING_IMPORTS_PER_USER}" in refused.value.message
    _import(core, ATTACKER, "squat-0", seed=5, p_block_w=51.0)  # replacing one's own stays allowed
    for index in range(MAX_PENDING_IMPORTS_PER_USER - 1):  # the victim is not blocked by the squatter
        assert _import(core, VICTIM, f"mine-{index}", seed=3, p_block_w=80.0).state == "pending"
    assert (VICTIM.uid, "train") in core.jobs.pending_imports  # type: ignore[union-attr]
    _register_victim(core, "train")
    exported = core.handle(VICTIM, p.ProfileExport("train"))
    assert isinstance(exported, p.ProfileReply)
    assert exported.p_block_w == 80.0

"""The daemon core without sockets: leases, save-before-write, restore, events, admin."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from perseus_client.protocol import (
    AdminReset,
    AdminResetOk,
    Claim,
    ComputationBegin,
    ComputationEnd,
    ErrorCode,
    ProtocolError,
    Release,
    SetClock,
    SetClockOk,
    StepBegin,
    StepEnd,
)

from perseusd.daemon.core import DaemonCore
from perseusd.leasing.identity import Caller
from tests.support.daemon_core import claim, sim_core_fixture

pytestmark = pytest.mark.timeout(30)


core = sim_core_fixture(2)


def _code(fn: object, *args: object) -> ErrorCode:
    with pytest.raises(ProtocolError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


def test_claim_needs_hello(core: DaemonCore) -> None:
    me = Caller(0, 0, os.getpid())
    assert _code(core.handle, me, Claim(gpus=(core.registry.uuids[0],), job="j")) == ErrorCode.NOT_REGISTERED


def test_original_saved_before_first_write_and_restored_on_release(core: DaemonCore, tmp_path: Path) -> None:
    me = Caller(0, 0, os.getpid())
    gpu = core.registry.uuids[0]
    claim(core, me, (gpu,), "j")
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["gpus"][gpu]["original"]["locked_sm_clock_mhz"] is None
    assert saved["gpus"][gpu]["lease"]["pid"] == os.getpid()
    reply = core.handle(me, SetClock(gpu=gpu, sm_clock_mhz=1003))
    assert isinstance(reply, SetClockOk)
    assert reply.applied_mhz in core.registry.info(gpu).supported_sm_clocks_mhz
    assert core.registry.read_all()[gpu].locked_sm_clock_mhz == reply.applied_mhz
    core.handle(me, Release(gpus=()))
    assert core.registry.read_all()[gpu].locked_sm_clock_mhz is None
    assert not (tmp_path / "state.json").exists()


def test_other_user_and_other_process_cannot_take_a_leased_gpu(
    core: DaemonCore, other_process: subprocess.Popen[bytes]
) -> None:
    me = Caller(0, 0, os.getpid())
    gpu = core.registry.uuids[0]
    claim(core, me, (gpu,), "j")
    stranger = Caller(1000, 1000, other_process.pid)
    sibling = Caller(0, 0, other_process.pid)
    core.leases.register(stranger, "s")
    assert _code(core.handle, stranger, Claim(gpus=(gpu,), job="s")) == ErrorCode.PERMISSION_DENIED
    assert _code(core.handle, stranger, SetClock(gpu=gpu, sm_clock_mhz=900)) == ErrorCode.PERMISSION_DENIED
    with pytest.raises(ProtocolError, match="PERMISSION_DENIED"):
        core.handle(stranger, AdminReset(gpus=()), admin_socket=True)
    core.leases.drop_session(other_process.pid)
    core.leases.register(sibling, "s")
    assert _code(core.handle, sibling, Claim(gpus=(gpu,), job="s")) == ErrorCode.GPU_BUSY
    assert _code(core.handle, sibling, Claim(gpus=("GPU-nope",), job="s")) == ErrorCode.UNKNOWN_GPU


def test_client_death_restores_its_gpus(core: DaemonCore, other_process: subprocess.Popen[bytes]) -> None:
    holder = Caller(0, 0, other_process.pid)
    gpus = core.registry.uuids
    claim(core, holder, gpus, "j")
    for gpu in gpus:
        core.handle(holder, SetClock(gpu=gpu, sm_clock_mhz=1000))
    outcome = core.client_died(other_process.pid)
    assert outcome.restored == gpus
    assert all(reading.locked_sm_clock_mhz is None for reading in core.registry.read_all().values())
    assert core.last_restore_s is not None
    assert core.health().clients == 0


def test_events_must_pair_up(core: DaemonCore) -> None:
    me = Caller(0, 0, os.getpid())
    gpu = core.registry.uuids[0]
    begin = ComputationBegin(gpu, 0, "forward", 1, 0, 0)
    end = ComputationEnd(gpu, 0, "forward", 1, 0, 1)
    assert _code(core.on_event, me, begin) == ErrorCode.NOT_LEASED
    claim(core, me, (gpu,), "j")
    assert _code(core.on_event, me, end) == ErrorCode.OUT_OF_ORDER
    core.on_event(me, begin)
    assert _code(core.on_event, me, begin) == ErrorCode.OUT_OF_ORDER
    core.on_event(me, end)
    core.on_event(me, StepBegin(gpu, 1, 0))
    assert _code(core.on_event, me, StepEnd(gpu, 2, 0)) == ErrorCode.OUT_OF_ORDER
    core.on_event(me, StepEnd(gpu, 1, 0))
    assert core.tracker.computations_completed == 1
    assert core.tracker.steps_completed == 1


def test_admin_reset_restores_and_drops_leases(core: DaemonCore) -> None:
    me = Caller(0, 0, os.getpid())
    gpu = core.registry.uuids[1]
    claim(core, me, (gpu,), "j")
    core.handle(me, SetClock(gpu=gpu, sm_clock_mhz=1000))
    reply = core.handle(me, AdminReset(gpus=()), admin_socket=True)
    assert isinstance(reply, AdminResetOk)
    assert set(reply.gpus) == set(core.registry.uuids)
    assert core.leases.holder(gpu) is None
    assert core.registry.read_all()[gpu].locked_sm_clock_mhz is None

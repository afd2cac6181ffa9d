"""The power cap writes a GPU's limit only when it changes or something else wrote over it: a recompute that
keeps the limits never waits on the main loop for an owner thread that is inside a clock set, and a limit an
admin or a restore wrote is written back at the next tick. A real core over simulated GPUs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from perseus_client.protocol import AdminSetPowerLimit, PowerLimitOk

from perseusd.daemon.core import DaemonCore
from perseusd.leasing.identity import Caller
from tests.support.daemon_core import busy_owner, sim_core

pytestmark = pytest.mark.timeout(120)
ROOT = Caller(uid=0, gid=0, pid=os.getpid())
SLOW_SET_S = 3.0
"""How long the slow GPU's clock set blocks its owner thread."""


def _limit_w(core: DaemonCore, gpu: str) -> float | None:
    return core.registry.read_all()[gpu].power_limit_w


def test_a_recompute_that_keeps_the_limits_does_not_wait_for_a_busy_gpu(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=2) as core:
        cap = core.power_cap
        assert cap is not None
        budget_w = sum(i.power_limit_max_w for i in core.registry.infos()) * 0.6
        cap.set_budget_w(budget_w, "admin")
        written = dict(cap.writer.limits_w)
        assert len(written) == 2
        for info in core.registry.infos():
            assert written[info.uuid] < 0.7 * info.power_limit_max_w
        slow = core.registry.uuids[1]
        setting = busy_owner(core.registry, slow, SLOW_SET_S)
        cap.set_budget_w(budget_w, "admin")  # the same budget: a recompute with the same limits
        assert not setting.done(), "the tick waited for the owner thread inside its clock set"
        assert cap.writer.limits_w == written
        assert cap.writer.write_error == ""
        setting.result(timeout=30)
        assert _limit_w(core, slow) == pytest.approx(written[slow])


def test_a_limit_written_by_an_admin_under_a_cap_is_written_back_at_the_next_tick(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=2) as core:
        cap = core.power_cap
        assert cap is not None
        cap.set_budget_w(sum(i.power_limit_max_w for i in core.registry.infos()) * 0.6, "admin")
        gpu = core.registry.uuids[0]
        capped_w = cap.writer.limits_w[gpu]
        reply = core.handle(ROOT, AdminSetPowerLimit(gpu=gpu, power_limit_w=capped_w + 50), admin_socket=True)
        assert isinstance(reply, PowerLimitOk)
        assert _limit_w(core, gpu) == pytest.approx(capped_w + 50)
        assert gpu not in cap.writer.limits_w
        cap.tick()
        assert cap.writer.limits_w[gpu] == capped_w
        assert _limit_w(core, gpu) == pytest.approx(capped_w)


def test_a_limit_written_outside_the_daemon_is_found_and_written_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with sim_core(tmp_path, gpus=2) as core:
        cap = core.power_cap
        assert cap is not None
        budget_w = sum(i.power_limit_max_w for i in core.registry.infos()) * 0.6
        cap.set_budget_w(budget_w, "admin")
        gpu = core.registry.uuids[0]
        capped_w = cap.writer.limits_w[gpu]
        device = core.registry._owner(gpu)._device
        device.set_power_limit_w(capped_w + 60)  # as nvidia-smi -pl would, past the daemon
        began_s = time.monotonic()
        while _limit_w(core, gpu) != pytest.approx(capped_w):
            assert time.monotonic() - began_s < 30, "the cap never wrote its limit back"
            cap.set_budget_w(budget_w, "admin")  # a recompute: the limits unchanged, the GPUs read
            time.sleep(0.05)
        assert cap.writer.limits_w[gpu] == capped_w
        assert "not the" in caplog.text
        assert "written by something else" in caplog.text

"""End to end: `perseusctl cap` against the real daemon on simulated H100s; limits as the GPUs were told."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from perseus_client.cap_messages import AdminSetCap, CapStatusReply

from perseusd.ctl.daemon_link import ask
from tests.support.perseusd_proc import (
    DaemonDirs,
    DaemonProcess,
    daemon_processes,
    run_as_user,
    sim_control,
    start_lease_holder,
    stop_process,
)

pytestmark = pytest.mark.timeout(120)

GPUS = 4
H100 = ("--sim-model", "h100_sxm")


@pytest.fixture
def make_daemon() -> Iterator[Callable[..., DaemonProcess]]:
    with daemon_processes() as make:
        yield make


def ctl(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(runtime_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def cap_status(runtime_dir: Path) -> dict[str, Any]:
    out = ctl(runtime_dir, "cap", "status", "--json")
    assert out.returncode == 0, out.stderr
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def limits_w(runtime_dir: Path, status: dict[str, Any]) -> list[float]:
    return [sim_control(runtime_dir, g["uuid"]).power_limit_w for g in status["gpus"]]


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline_s, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def test_cap_set_infeasible_clear(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=GPUS, extra_args=H100).start()
    run = dirs.runtime_dir
    out = ctl(run, "cap", "set", "--node", "1000")
    assert out.returncode == 0, out.stderr
    status = cap_status(run)
    assert status["grant_w"] == 1000.0
    assert status["floor_w"] == 800.0
    assert status["demand_w"] == 2800.0
    assert status["feasible"]
    assert status["set_by"].startswith("uid ")
    assert sum(limits_w(run, status)) <= 1000.0 + 1e-6
    assert status["limits_sum_w"] == pytest.approx(sum(limits_w(run, status)))
    assert "<= grant (hard line)" in ctl(run, "cap", "status").stdout  # idle GPUs: held by limits alone
    assert all(200.0 <= w <= 700.0 for w in limits_w(run, status))
    assert "node budget set to 1000.0 W by uid" in daemon.log()

    out = ctl(run, "cap", "set", "--node", "500")  # below the floor: reported, never an impossible limit
    assert out.returncode == 1
    assert "INFEASIBLE" in out.stdout
    status = cap_status(run)
    assert not status["feasible"]
    assert "floor 800 W" in status["problem"]
    assert limits_w(run, status) == [200.0] * GPUS

    out = ctl(run, "cap", "clear")
    assert out.returncode == 0, out.stderr
    status = cap_status(run)
    assert status["grant_w"] is None
    assert not status["active"]
    assert limits_w(run, status) == [700.0] * GPUS
    wait_for(lambda: cap_status(run)["measured_w"] is not None, "power measured from the counters")
    assert 0 < cap_status(run)["measured_w"] < 4 * 700.0


def test_cap_needs_the_admin_socket(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    make_daemon(dirs, gpus=2, extra_args=H100).start()
    with pytest.raises(AssertionError, match=r"PERMISSION|permission|admin"):
        run_as_user(lambda: ask(dirs.runtime_dir, AdminSetCap(budget_w=500.0), CapStatusReply, admin=True))


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_limits_restored_on_stop_and_after_a_crash(
    make_daemon: Callable[..., DaemonProcess], how: str
) -> None:
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=2, extra_args=H100).start()
    run = dirs.runtime_dir
    assert ctl(run, "cap", "set", "--node", "600").returncode == 0
    uuids = [g["uuid"] for g in cap_status(run)["gpus"]]
    assert [sim_control(run, u).power_limit_w for u in uuids] == [300.0, 300.0]
    if how == "sigterm":
        daemon.signal(signal.SIGTERM)
        daemon.wait()
    else:
        daemon.kill()
        assert [sim_control(run, u).power_limit_w for u in uuids] == [300.0, 300.0]
        make_daemon(dirs, gpus=2, extra_args=H100).start()  # reconciles the state file
    assert [sim_control(run, u).power_limit_w for u in uuids] == [700.0, 700.0]


def test_cap_written_again_after_a_lease_restores_the_gpu(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    make_daemon(dirs, gpus=2, extra_args=H100).start()
    run = dirs.runtime_dir
    holder = start_lease_holder(run, 1200)
    try:
        assert ctl(run, "cap", "set", "--node", "600").returncode == 0
        uuid = cap_status(run)["gpus"][0]["uuid"]
        assert sim_control(run, uuid).power_limit_w == 300.0
    finally:
        stop_process(holder)  # the release restores the GPU's original (700 W, unlocked) ...
    wait_for(lambda: sim_control(run, uuid).locked_sm_clock_mhz is None, "the lease restored")
    wait_for(lambda: sim_control(run, uuid).power_limit_w == 300.0, "the cap written again")  # ... then this


def test_job_priority_is_set_and_checked(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=1, extra_args=H100).start()
    out = ctl(dirs.runtime_dir, "cap", "priority", "train-a", "low")
    assert out.returncode == 0
    assert "priority low (0)" in out.stdout
    assert "job train-a priority set to 0 by uid" in daemon.log()
    out = ctl(dirs.runtime_dir, "cap", "priority", "train-a", "urgent")
    assert out.returncode != 0

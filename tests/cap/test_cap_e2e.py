"""End to end: `perseusctl cap` against the real daemon on simulated H100s; limits as the GPUs were told."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from perseus_client.cap_messages import AdminSetCap, CapStatusReply

from perseusd.ctl.daemon_link import ask
from tests.support.ctl import run_ctl
from tests.support.perseusd_proc import (
    DaemonDirs,
    DaemonProcess,
    daemon_processes,
    lease_holder,
    run_as_user,
    sim_control,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(120)

GPUS = 4
H100 = ("--sim-model", "h100_sxm")


@pytest.fixture
def make_daemon() -> Iterator[Callable[..., DaemonProcess]]:
    with daemon_processes() as make:
        yield make


def cap_status(runtime_dir: Path) -> dict[str, Any]:
    out = run_ctl(runtime_dir, "cap", "status", "--json")
    assert out.returncode == 0, out.stderr
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def limits_w(runtime_dir: Path, status: dict[str, Any]) -> list[float]:
    return [sim_control(runtime_dir, g["uuid"]).power_limit_w for g in status["gpus"]]


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    wait_until(check, timeout_s, what)


def test_cap_set_infeasible_clear(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=GPUS, extra_args=H100).start()
    run = dirs.runtime_dir
    out = run_ctl(run, "cap", "set", "--node", "1000")
    assert out.returncode == 0, out.stderr
    status = cap_status(run)
    assert status["grant_w"] == 1000.0
    assert status["floor_w"] == 800.0
    assert status["demand_w"] == 2800.0
    assert status["feasible"]
    assert status["set_by"].startswith("uid ")
    assert sum(limits_w(run, status)) <= 1000.0 + 1e-6
    assert status["limits_sum_w"] == pytest.approx(sum(limits_w(run, status)))
    assert "<= grant (hard line)" in run_ctl(run, "cap", "status").stdout  # idle GPUs: held by limits alone
    assert all(200.0 <= w <= 700.0 for w in limits_w(run, status))
    assert "node budget set to 1000.0 W by uid" in daemon.log()

    before = limits_w(run, status)
    out = run_ctl(run, "cap", "set", "--node", "500")  # below the floor: refused, nothing changes (exit 1)
    assert out.returncode == 1
    assert "the node budget 500 W is below the node's floor of 800 W" in out.stderr
    assert "nothing changed" in out.stderr
    status = cap_status(run)
    assert status["grant_w"] == 1000.0
    assert status["feasible"]
    assert limits_w(run, status) == before

    out = run_ctl(run, "cap", "clear")
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


def test_budget_kept_across_a_crash_and_limits_held(make_daemon: Callable[..., DaemonProcess]) -> None:
    """A crash must not lift a cap: the restarted daemon reconciles the GPUs, then holds the budget again
    (and the priorities), before any job comes back; `cap clear` drops it for good."""
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=2, extra_args=H100).start()
    run = dirs.runtime_dir
    assert run_ctl(run, "cap", "set", "--node", "600").returncode == 0
    set_by = cap_status(run)["set_by"]
    uuids = [g["uuid"] for g in cap_status(run)["gpus"]]
    assert [sim_control(run, u).power_limit_w for u in uuids] == [300.0, 300.0]
    saved = dirs.state_dir / "power-cap.json"
    assert saved.stat().st_mode & 0o777 == 0o600
    daemon.kill()
    assert [sim_control(run, u).power_limit_w for u in uuids] == [300.0, 300.0]

    daemon = make_daemon(dirs, gpus=2, extra_args=H100).start()
    status = cap_status(run)
    assert status["budget_w"] == 600.0
    assert status["grant_w"] == 600.0
    assert status["set_by"] == set_by
    assert status["problem"] == ""
    assert [sim_control(run, u).power_limit_w for u in uuids] == [300.0, 300.0]
    assert sum(limits_w(run, status)) <= 600.0 + 1e-6
    # The log is a file another process writes: read it until the lines are there.
    wait_for(lambda: "node budget 600.0 W (set by uid" in daemon.log(), "the budget's log line")
    wait_for(lambda: "kept across a restart" in daemon.log(), "the restart's log line")

    assert run_ctl(run, "cap", "clear").returncode == 0
    assert [sim_control(run, u).power_limit_w for u in uuids] == [700.0, 700.0]
    assert not saved.exists()  # no budget and no priority: nothing to keep
    daemon.kill()
    make_daemon(dirs, gpus=2, extra_args=H100).start()
    assert cap_status(run)["budget_w"] is None
    assert [sim_control(run, u).power_limit_w for u in uuids] == [700.0, 700.0]


def test_limits_restored_on_stop_and_the_budget_held_again_at_start(
    make_daemon: Callable[..., DaemonProcess],
) -> None:
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=2, extra_args=H100).start()
    run = dirs.runtime_dir
    assert run_ctl(run, "cap", "set", "--node", "600").returncode == 0
    uuids = [g["uuid"] for g in cap_status(run)["gpus"]]
    daemon.signal(signal.SIGTERM)
    daemon.wait()
    assert [sim_control(run, u).power_limit_w for u in uuids] == [700.0, 700.0]  # stop restores
    make_daemon(dirs, gpus=2, extra_args=H100).start()
    assert cap_status(run)["budget_w"] == 600.0
    assert [sim_control(run, u).power_limit_w for u in uuids] == [300.0, 300.0]
    assert run_ctl(run, "cap", "clear").returncode == 0
    assert not (dirs.state_dir / "power-cap.json").exists()


def test_an_unsafe_cap_file_is_refused_and_reported(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    dirs.state_dir.mkdir(mode=0o700, parents=True)
    saved = dirs.state_dir / "power-cap.json"
    saved.write_text(json.dumps({"version": 1, "budget_w": 400.0, "set_by": "x", "priorities": {}}))
    saved.chmod(0o666)  # anyone could have written it
    daemon = make_daemon(dirs, gpus=2, extra_args=H100).start()
    status = cap_status(dirs.runtime_dir)
    assert status["budget_w"] is None
    assert "writable by group or others" in status["problem"]
    assert "no budget restored" in daemon.log()
    assert saved.exists()


def test_cap_written_again_after_a_lease_restores_the_gpu(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    make_daemon(dirs, gpus=2, extra_args=H100).start()
    run = dirs.runtime_dir
    with lease_holder(run, 1200):  # its end restores the GPU's original (700 W, unlocked) ...
        assert run_ctl(run, "cap", "set", "--node", "600").returncode == 0
        uuid = cap_status(run)["gpus"][0]["uuid"]
        assert sim_control(run, uuid).power_limit_w == 300.0
    wait_for(lambda: sim_control(run, uuid).locked_sm_clock_mhz is None, "the lease restored")
    wait_for(lambda: sim_control(run, uuid).power_limit_w == 300.0, "the cap written again")  # ... then this


def test_job_priority_is_set_and_checked(make_daemon: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    daemon = make_daemon(dirs, gpus=1, extra_args=H100).start()
    out = run_ctl(dirs.runtime_dir, "cap", "priority", "train-a", "low")  # no such job: refused, nothing kept
    assert out.returncode == 1
    assert "no job train-a on this node" in out.stderr
    assert "priority set" not in daemon.log()
    out = run_ctl(dirs.runtime_dir, "cap", "priority", "train-a", "urgent")
    assert out.returncode != 0

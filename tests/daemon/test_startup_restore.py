"""Start-up restores first: whatever fails at start (a state file it cannot read, the metrics port taken, a
bad configuration), every GPU the last run touched gets its clocks and power limit back before the daemon
serves or exits; `perseusd reset` restores power limits even without a readable state file."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from perseusd.gpu.sim_shared import ControlState, StateMap, state_path
from perseusd.private_file import MAX_PRIVATE_BYTES
from tests.support.perseusd_proc import (
    DaemonDirs,
    DaemonProcess,
    sim_control,
    sim_gpu_uuids,
)

pytestmark = pytest.mark.timeout(60)

LOCKED_MHZ = 1005
CAPPED_W = 200.0
DEFAULT_W = 500.0  # the simulated A100-SXM4-80GB's default power limit


@pytest.fixture
def crashed(make_daemon: Callable[..., DaemonProcess]) -> tuple[DaemonDirs, str]:
    """The node a crashed daemon left: GPU 0 locked at 1005 MHz and capped at 200 W, its original (unlocked,
    500 W) in the state file."""
    dirs = DaemonDirs.create()
    first = make_daemon(dirs, gpus=2).start()  # creates the simulated GPUs' files
    first.stop()
    uuid = sim_gpu_uuids(1)[0]
    assert sim_control(dirs.runtime_dir, uuid).power_limit_w == DEFAULT_W
    gpu = StateMap(state_path(dirs.runtime_dir / "sim", uuid), writable=True)
    gpu.write_control(ControlState(LOCKED_MHZ, CAPPED_W))
    gpu.close()
    _write_state(dirs.state_dir / "state.json", uuid, job="j")
    return dirs, uuid


def _write_state(path: Path, uuid: str, job: str) -> None:
    lease = {"pid": 999_999_999, "start_time": 1, "uid": 0, "job": job}
    gpu = {"original": {"locked_sm_clock_mhz": None, "power_limit_w": DEFAULT_W}, "lease": lease,
           "restore_error": None}  # fmt: skip
    body = {"schema": 1, "daemon": {"pid": 1, "start_time": 1}, "gpus": {uuid: gpu}}
    path.write_text(json.dumps(body))
    path.chmod(0o600)


def _restored(dirs: DaemonDirs, uuid: str) -> bool:
    control = sim_control(dirs.runtime_dir, uuid)
    return control.locked_sm_clock_mhz is None and control.power_limit_w == DEFAULT_W


def test_state_file_too_large_to_read_restores_defaults_and_serves(
    make_daemon: Callable[..., DaemonProcess], crashed: tuple[DaemonDirs, str]
) -> None:
    dirs, uuid = crashed
    _write_state(dirs.state_dir / "state.json", uuid, job="x" * (MAX_PRIVATE_BYTES + 1))
    daemon = make_daemon(dirs, gpus=2).start()
    assert _restored(dirs, uuid), daemon.log()
    assert not (dirs.state_dir / "state.json").exists()
    (aside,) = dirs.state_dir.glob("state.json.unreadable-*")
    assert aside.stat().st_size > MAX_PRIVATE_BYTES  # kept for an operator, never deleted
    assert "restoring every GPU to its defaults" in daemon.log()
    assert daemon.status()["gpus"][0]["lease"] is None


def test_reset_restores_power_limits_without_a_readable_state_file(
    make_daemon: Callable[..., DaemonProcess], crashed: tuple[DaemonDirs, str]
) -> None:
    dirs, uuid = crashed
    (dirs.state_dir / "state.json").write_text("{not json")
    reset = make_daemon(dirs, gpus=2, extra_args=("reset",)).start(wait=False)
    assert reset.wait() == 0, reset.log()
    assert _restored(dirs, uuid), reset.log()
    make_daemon(dirs, gpus=2).start()  # and the daemon starts again without anyone deleting a file


def test_failed_start_restores_before_exiting(
    make_daemon: Callable[..., DaemonProcess], crashed: tuple[DaemonDirs, str]
) -> None:
    dirs, uuid = crashed
    env = {"PERSEUSD_METRICS_TEXTFILE_DIR": str(dirs.base / "no-such-directory")}
    daemon = make_daemon(dirs, gpus=2, env=env).start(wait=False)
    assert daemon.wait() == 1, daemon.log()
    assert "metrics:" in daemon.log()
    assert _restored(dirs, uuid), daemon.log()
    assert not (dirs.state_dir / "state.json").exists()


def test_metrics_port_squatted_the_daemon_serves_and_takes_it_later(
    make_daemon: Callable[..., DaemonProcess],
    crashed: tuple[DaemonDirs, str],
) -> None:
    dirs, uuid = crashed
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    daemon = make_daemon(dirs, gpus=2, env={"PERSEUSD_METRICS_HTTP_PORT": str(port)}).start()
    assert _restored(dirs, uuid), daemon.log()
    assert "taken by another process" in daemon.log()
    squatter.close()
    deadline_s = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                assert b"perseus_gpu_up" in response.read()
                break
        except OSError:
            assert time.monotonic() < deadline_s, daemon.log()
            time.sleep(0.2)


def test_bad_configuration_restores_before_exiting(
    make_daemon: Callable[..., DaemonProcess], crashed: tuple[DaemonDirs, str]
) -> None:
    dirs, uuid = crashed
    daemon = make_daemon(dirs, gpus=2, env={"PERSEUSD_CARBON_ETA": "7"}).start(wait=False)
    assert daemon.wait() == 2, daemon.log()
    assert "carbon_eta must be 0..1" in daemon.log()
    assert _restored(dirs, uuid), daemon.log()

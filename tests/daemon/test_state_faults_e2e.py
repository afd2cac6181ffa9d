"""The real daemon with its state directory on a real tiny filesystem (a 64 KiB tmpfs): full, then read-only.

Needs permission to mount (root, or CAP_SYS_ADMIN); skipped with the reason otherwise. Every case: no
acknowledged change is lost, state.json is read back whole, the daemon keeps serving a well-behaved client,
no GPU is left locked, and `perseusctl status` says persistence is failing until the directory recovers.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from perseus_client.client import PerseusClient

from perseusd.leasing.state_file import load_state
from tests.support.ctl import run_ctl
from tests.support.perseusd_proc import (
    DaemonDirs,
    DaemonProcess,
    client_outcome,
    sim_control,
    start_lease_holder,
    stop_process,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(120)

LOCK_MHZ = 1200
RECOVERY_TIMEOUT_S = 60.0  # the retry back-off doubles to 30 s; generous, never a speed assertion


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def tiny_dirs(make_daemon: Callable[..., DaemonProcess]) -> Iterator[DaemonDirs]:
    """Daemon directories whose state_dir is a fresh 64 KiB tmpfs (unmounted at the end)."""
    del make_daemon  # requested first so that the daemons stop after the unmount below
    dirs = DaemonDirs.create()
    dirs.state_dir.mkdir(mode=0o700)
    mounted = _mount("-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(dirs.state_dir))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs here ({mounted.stderr.strip()}); needs root/CAP_SYS_ADMIN")
    try:
        yield dirs
    finally:
        subprocess.run(["umount", "-l", str(dirs.state_dir)], capture_output=True, timeout=30, check=False)


def _fill(state_dir: Path) -> Path:
    """Fill the filesystem to the last byte; the filler is removed to make room again."""
    filler = state_dir / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


def _state(state_dir: Path) -> dict[str, Any]:
    """state.json parsed whole (a truncated file fails here) and accepted by the daemon's own loader."""
    path = state_dir / "state.json"
    body: dict[str, Any] = json.loads(path.read_bytes())
    assert load_state(path) is not None
    return body


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = RECOVERY_TIMEOUT_S) -> None:
    wait_until(condition, timeout_s, what)


def _persistence_error(daemon: DaemonProcess) -> str | None:
    error: str | None = daemon.status()["daemon"]["persistence_error"]
    return error


def _text_status(daemon: DaemonProcess) -> str:
    return run_ctl(daemon.dirs.runtime_dir, "status", check=True).stdout


def _assert_serves_and_refuses_new_lease(daemon: DaemonProcess, gpu_index: int) -> None:
    """A well-behaved client connects and reads status; a lease that cannot be recorded is refused."""
    uuids = [str(row["uuid"]) for row in daemon.status()["gpus"]]
    code, message = client_outcome(daemon.dirs.runtime_dir, lambda c: c.claim([uuids[gpu_index]]))
    assert code == "STATE_WRITE_FAILED", message
    assert sim_control(daemon.dirs.runtime_dir, uuids[gpu_index]).locked_sm_clock_mhz is None
    with PerseusClient(daemon.dirs.runtime_dir, job="probe", timeout_s=5.0) as client:
        assert len(client.daemon_info.gpus) == len(uuids)


def test_full_state_filesystem(make_daemon: Callable[..., DaemonProcess], tiny_dirs: DaemonDirs) -> None:
    daemon = make_daemon(tiny_dirs, gpus=3).start()
    uuids = [str(row["uuid"]) for row in daemon.status()["gpus"]]
    first, second = (
        start_lease_holder(tiny_dirs.runtime_dir, LOCK_MHZ),
        start_lease_holder(tiny_dirs.runtime_dir, LOCK_MHZ, first=1),
    )
    try:
        acknowledged = _state(tiny_dirs.state_dir)
        assert sorted(acknowledged["gpus"]) == sorted(uuids[:2])
        filler = _fill(tiny_dirs.state_dir)
        first.kill()  # the client-death path must rewrite state.json, on a full disk
        _wait_for(lambda: sim_control(tiny_dirs.runtime_dir, uuids[0]).locked_sm_clock_mhz is None, "restore")
        error = _persistence_error(daemon)
        assert error is not None
        assert "No space left on device" in error
        assert "PERSISTENCE FAILING" in _text_status(daemon)
        assert _state(tiny_dirs.state_dir) == acknowledged  # whole, and still holds both originals
        _assert_serves_and_refuses_new_lease(daemon, 2)
        assert daemon.proc is not None
        assert daemon.proc.poll() is None
        assert "PERSISTENCE FAILING" in daemon.log()

        filler.unlink()
        _wait_for(lambda: _persistence_error(daemon) is None, "the retried write")
        assert sorted(_state(tiny_dirs.state_dir)["gpus"]) == [uuids[1]]
        second.kill()
        _wait_for(lambda: not (tiny_dirs.state_dir / "state.json").exists(), "state.json removed")
    finally:
        stop_process(first)
        stop_process(second)
    for uuid in uuids:
        assert sim_control(tiny_dirs.runtime_dir, uuid).locked_sm_clock_mhz is None


def test_read_only_state_filesystem_then_reset(
    make_daemon: Callable[..., DaemonProcess], tiny_dirs: DaemonDirs
) -> None:
    daemon = make_daemon(tiny_dirs, gpus=3).start()
    uuids = [str(row["uuid"]) for row in daemon.status()["gpus"]]
    first, second = (
        start_lease_holder(tiny_dirs.runtime_dir, LOCK_MHZ),
        start_lease_holder(tiny_dirs.runtime_dir, LOCK_MHZ, first=1),
    )
    read_only = False
    try:
        acknowledged = _state(tiny_dirs.state_dir)
        remounted = _mount("-o", "remount,ro", str(tiny_dirs.state_dir))
        assert remounted.returncode == 0, remounted.stderr
        read_only = True
        first.kill()
        _wait_for(lambda: sim_control(tiny_dirs.runtime_dir, uuids[0]).locked_sm_clock_mhz is None, "restore")
        error = _persistence_error(daemon)
        assert error is not None
        assert "Read-only file system" in error
        _assert_serves_and_refuses_new_lease(daemon, 2)
        assert _state(tiny_dirs.state_dir) == acknowledged

        # The daemon dies while the file is stale: `perseusd reset` still reads it and restores everything.
        daemon.signal(signal.SIGKILL)
        daemon.wait()
        stop_process(second)
        assert sim_control(tiny_dirs.runtime_dir, uuids[1]).locked_sm_clock_mhz == LOCK_MHZ
        reset = make_daemon(tiny_dirs, gpus=3, extra_args=("reset",)).start(wait=False)
        assert reset.wait() == 0, reset.log()
        assert _state(tiny_dirs.state_dir) == acknowledged  # read-only still: left for the next start
    finally:
        if read_only:
            _mount("-o", "remount,rw", str(tiny_dirs.state_dir))
        stop_process(first)
        stop_process(second)
    for uuid in uuids:
        assert sim_control(tiny_dirs.runtime_dir, uuid).locked_sm_clock_mhz is None
    restarted = make_daemon(tiny_dirs, gpus=3).start()  # reconciles the stale file, then removes it
    _wait_for(lambda: not (tiny_dirs.state_dir / "state.json").exists(), "state.json removed")
    assert _persistence_error(restarted) is None
    with contextlib.suppress(ProcessLookupError):
        restarted.stop()

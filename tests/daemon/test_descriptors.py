"""Descriptor exhaustion: a daemon started under the usual low soft RLIMIT_NOFILE (1024) and flooded with
1,100 connections by one unprivileged process (which once made ZeroMQ abort it) raises its soft limit, shuts
down the connections over the per-user budget, keeps serving others and leaves no GPU locked."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

from perseusd.daemon.limits import MAX_CONNECTIONS_PER_USER
from tests.support.frames import assert_serves_and_nothing_locked
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes, flood_as_nobody

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody needs root"),
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)"),
]

SOFT_NOFILE, HARD_NOFILE = 1024, 4096
FLOOD_CONNECTIONS = 1100


class LowLimitDaemon(DaemonProcess):
    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={SOFT_NOFILE}:{HARD_NOFILE}", "--", *super().command()]


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        low = LowLimitDaemon(dirs, gpus=2, env={"PERSEUSD_SOCKET_GROUP": "nogroup"})
        make(dirs)  # registers the directory for clean-up
        try:
            yield low.start()
        finally:
            low.stop()


def test_connection_flood_under_a_low_limit(daemon: DaemonProcess) -> None:
    path = str(daemon.dirs.runtime_dir / "control.sock")
    pid, read_fd = flood_as_nobody(path, FLOOD_CONNECTIONS)
    try:
        with os.fdopen(read_fd) as ready:
            opened = int(ready.readline())
        assert opened == FLOOD_CONNECTIONS  # more than the daemon's soft limit at its start
        over_budget = opened - MAX_CONNECTIONS_PER_USER
        deadline_s = time.monotonic() + 30
        while daemon.status()["daemon"]["connections_refused"] < over_budget:
            assert time.monotonic() < deadline_s, daemon.status()["daemon"]
            time.sleep(0.2)
        assert daemon.proc is not None
        assert daemon.proc.poll() is None, daemon.log()
        assert_serves_and_nothing_locked(
            daemon.dirs.runtime_dir, state_dir=daemon.dirs.state_dir
        )  # root still gets through
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert_serves_and_nothing_locked(daemon.dirs.runtime_dir, state_dir=daemon.dirs.state_dir)
    assert daemon.proc.poll() is None, daemon.log()
    assert "refused a connection (uid 65534)" in daemon.log()
    assert daemon.status()["daemon"]["connections"] < MAX_CONNECTIONS_PER_USER  # the flood's are closed

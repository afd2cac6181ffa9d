"""Fixtures of the container tests: a daemon on simulated GPUs whose sockets admit the containers' group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.containers.namespaces import missing_requirement
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.requirements import skip_unless_met

GPUS = 4


def open_simulated_boards(daemon: DaemonProcess) -> None:
    """Let workloads of other users (a container's mapped uid) drive the simulated GPUs' busy files, as the
    device nodes of real GPUs are open to them (mode 0666 on a stock driver)."""
    for busy in (daemon.dirs.runtime_dir / "sim").glob("*.busy"):
        busy.chmod(0o666)


@pytest.fixture(scope="module")
def container_daemon() -> Iterator[DaemonProcess]:
    """4 simulated A100s, socket group nogroup (the containers' group), a fast energy counter."""
    skip_unless_met(missing_requirement())
    env = {
        "PERSEUSD_SOCKET_GROUP": "nogroup",
        "PERSEUSD_SIM_UPDATE_PERIOD_S": "0.02",
        "PERSEUSD_PROFILE_CLOCK_STRIDE": "6",
    }
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=GPUS, env=env).start()
        open_simulated_boards(daemon)
        yield daemon

"""Fixtures shared by the daemon's tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process other than this one (a client that is not the caller), killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def make_daemon() -> Iterator[Callable[..., DaemonProcess]]:
    """Makes daemon processes (`daemon_processes`), every one stopped at the end."""
    with daemon_processes() as make:
        yield make


@pytest.fixture
def dirs() -> DaemonDirs:
    """Fresh runtime and state directories for a daemon."""
    return DaemonDirs.create()

"""Fixtures shared by the daemon's tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process other than this one (a client that is not the caller), killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)

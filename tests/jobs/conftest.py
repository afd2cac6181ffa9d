"""The jobs tests' daemon core: two simulated GPUs, default job settings, nothing registered yet. A file whose
tests need another core (more GPUs, a job already running) defines its own `core` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.daemon.core import DaemonCore
from perseusd.jobs.settings import JobSettings
from tests.support.daemon_core import sim_core


@pytest.fixture
def core(tmp_path: Path) -> Iterator[DaemonCore]:
    with sim_core(tmp_path, gpus=2, jobs=JobSettings()) as built:
        yield built

"""Training processes in real podman containers (Debian's podman, a local image, a user namespace) against
the host's perseusd on simulated GPUs: identity from the kernel, GPUs by what the container holds, restore
when the container is killed, and a training job's closed loop."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers import readings
from tests.containers.podman import (
    PODMAN_UID_BASE,
    Podman,
    device_nodes,
    missing_requirement,
    podman_storage,
)
from tests.support.perseusd_proc import DaemonProcess, sim_control
from tests.support.polling import wait_until
from tests.support.requirements import skip_unless_met

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    skip_unless_met(missing_requirement())
    with podman_storage() as storage:
        yield storage


def test_a_podman_container_claims_its_gpu_and_its_death_restores_it(
    podman: Podman, container_daemon: DaemonProcess, tmp_path: Path
) -> None:
    daemon = container_daemon
    uuids = [row["uuid"] for row in readings.gpu_rows(daemon)]
    nodes = device_nodes(tmp_path / "dev", [1, 2])
    container, attached = podman.start(
        [sys.executable, readings.CLIENT, str(readings.CLOCK_MHZ)],
        daemon.dirs.runtime_dir,
        nodes,
        env={"CUDA_VISIBLE_DEVICES": "1"},
    )
    try:
        seen = readings.first_json_line(attached)
        host_pid = podman.pid(container)
        assert seen["pid"] == 1
        assert seen["uid"] == 0
        assert seen["visible"] == [uuids[1], uuids[2]]
        assert seen["mine"] == uuids[2]
        assert seen["applied_mhz"] == readings.CLOCK_MHZ
        assert seen["other"] == "PERMISSION_DENIED"
        lease = readings.gpu_rows(daemon)[2]["lease"]
        assert lease["pid"] == host_pid
        assert lease["uid"] == PODMAN_UID_BASE
        assert sim_control(daemon.dirs.runtime_dir, uuids[2]).locked_sm_clock_mhz == readings.CLOCK_MHZ
        os.kill(host_pid, signal.SIGKILL)  # the container dies (podman kill would do the same)
        unleased = lambda: readings.gpu_rows(daemon)[2]["lease"] is None  # noqa: E731
        wait_until(unleased, readings.RESTORE_TIMEOUT_S, "the lease to end with the container")
        assert sim_control(daemon.dirs.runtime_dir, uuids[2]).locked_sm_clock_mhz is None
    finally:
        attached.kill()
        attached.communicate(timeout=30)
        podman.remove(container)


def test_a_training_job_in_podman_runs_its_plan_and_saves_energy(
    podman: Podman, container_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """perseus-emulate (2 stages, one process each) in a podman container given host GPUs 2 and 3."""
    daemon = container_daemon
    uuids = [row["uuid"] for row in readings.gpu_rows(daemon)]
    command = readings.emulated_training("in-podman")
    container, attached = podman.start(command, daemon.dirs.runtime_dir, device_nodes(tmp_path, [2, 3]))
    try:
        out, err = attached.communicate(timeout=240)
    finally:
        podman.remove(container)
    assert attached.returncode == 0, err
    readings.assert_trained(json.loads(out), daemon, [uuids[2], uuids[3]])

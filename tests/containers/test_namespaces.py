"""Training processes in containers of real namespaces (unshare, nsenter) talking to the host's perseusd.

Each container has its own pid, user (root inside, an unprivileged uid outside), mount (its own /dev with the
GPU device nodes it was given, the runtime directory bind-mounted) and cgroup namespaces. The daemon knows
each caller by the host pid and uid the kernel reports, names its GPUs by what its container holds, refuses
the others, and restores the GPUs when the container dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.containers import readings
from tests.containers.namespaces import CONTAINER_UID, container_command, container_pid, enter_command
from tests.support.perseusd_proc import DaemonProcess, sim_control
from tests.support.polling import wait_until

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def container(
    daemon: DaemonProcess,
    command: Sequence[str],
    minors: Sequence[int],
    scratch: Path,
    *,
    env: dict[str, str] | None = None,
    time_offset_s: int = 0,
) -> Iterator[subprocess.Popen[str]]:
    """A container running `command`; killed (its whole pid namespace) on exit."""
    argv = container_command(command, daemon.dirs.runtime_dir, minors, scratch, time_offset_s=time_offset_s)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(AssertionError, ProcessLookupError):
                os.kill(container_pid(proc, 2.0), signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
        proc.communicate(timeout=10)


def _wait_unleased(daemon: DaemonProcess, uuid: str) -> None:
    def unleased() -> bool:
        return not any(row["uuid"] == uuid and row["lease"] for row in readings.gpu_rows(daemon))

    wait_until(unleased, readings.RESTORE_TIMEOUT_S, f"GPU {uuid}'s lease to end")


def test_a_container_claims_the_gpu_it_was_given_by_its_own_index(
    container_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Given host GPUs 2 and 3, CUDA_VISIBLE_DEVICES=1 inside names host GPU 3; the daemon sees the host pid
    and the mapped uid, refuses GPU 0 (not given), and restores GPU 3 when the container is killed."""
    daemon = container_daemon
    uuids = [row["uuid"] for row in readings.gpu_rows(daemon)]
    with container(
        daemon,
        [sys.executable, readings.CLIENT, str(readings.CLOCK_MHZ)],
        [2, 3],
        tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "1"},
    ) as proc:
        seen = readings.first_json_line(proc)
        host_pid = container_pid(proc)
        assert seen["pid"] == 1
        assert seen["uid"] == 0
        assert seen["visible"] == [uuids[2], uuids[3]]
        assert seen["mine"] == uuids[3]
        assert seen["applied_mhz"] == readings.CLOCK_MHZ
        assert seen["other"] == "PERMISSION_DENIED", seen
        assert "not among the GPUs given" in seen["other_message"]
        lease = readings.gpu_rows(daemon)[3]["lease"]
        assert lease["pid"] == host_pid != 1  # what the kernel says of it
        assert lease["uid"] == CONTAINER_UID
        assert sim_control(daemon.dirs.runtime_dir, uuids[3]).locked_sm_clock_mhz == readings.CLOCK_MHZ
        assert all(row["lease"] is None for i, row in enumerate(readings.gpu_rows(daemon)) if i != 3)
        os.kill(host_pid, signal.SIGKILL)  # the container's pid 1: the whole container dies
        _wait_unleased(daemon, uuids[3])
    assert sim_control(daemon.dirs.runtime_dir, uuids[3]).locked_sm_clock_mhz is None


def test_a_second_process_entered_into_the_container_sees_the_same_gpus(
    container_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """nsenter (podman exec's way in): a second process in the same container, its own lease, its own pid."""
    daemon = container_daemon
    uuids = [row["uuid"] for row in readings.gpu_rows(daemon)]
    hold = [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.readline()"]
    with container(daemon, hold, [0, 1], tmp_path) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        init_pid = container_pid(proc)
        entered = subprocess.Popen(
            enter_command(init_pid, [sys.executable, readings.CLIENT, str(readings.CLOCK_MHZ)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1"},
        )
        try:
            seen = readings.first_json_line(entered)
            assert seen["visible"] == [uuids[0], uuids[1]]
            assert seen["mine"] == uuids[1]
            assert seen["other"] == "PERMISSION_DENIED"
            assert seen["pid"] != 1
            lease = readings.gpu_rows(daemon)[1]["lease"]
            assert lease["uid"] == CONTAINER_UID
            assert lease["pid"] not in (seen["pid"], init_pid)
            assert entered.stdin is not None
            entered.stdin.write("go\n")
            entered.stdin.flush()
            assert entered.wait(timeout=30) == 0
        finally:
            if entered.poll() is None:
                entered.kill()
            entered.communicate(timeout=10)
        _wait_unleased(daemon, uuids[1])
    assert sim_control(daemon.dirs.runtime_dir, uuids[1]).locked_sm_clock_mhz is None


def test_a_container_without_gpus_may_claim_none(container_daemon: DaemonProcess, tmp_path: Path) -> None:
    daemon = container_daemon
    script = (
        "import json\n"
        "from perseus_client import PerseusClient\n"
        "from perseus_client.client import PerseusClientError\n"
        "c = PerseusClient('/run/perseusd', job='no-gpu', strict=True)\n"
        "try:\n"
        "    c.claim([c.daemon_info.gpus[0].uuid]); code = 'ok'\n"
        "except PerseusClientError as exc:\n"
        "    code = exc.code\n"
        "print(json.dumps({'visible': c.daemon_info.visible_gpus, 'code': code}), flush=True)\n"
    )
    with container(daemon, [sys.executable, "-c", script], [], tmp_path) as proc:
        seen = readings.first_json_line(proc)
    assert seen == {"visible": [], "code": "PERMISSION_DENIED"}


def test_a_shifted_monotonic_clock_is_refused_at_hello(
    container_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A time namespace would shift every event timestamp: the daemon says so instead of mis-planning."""
    script = (
        "from perseus_client import PerseusClient\n"
        "from perseus_client.client import PerseusClientError\n"
        "try:\n"
        "    PerseusClient('/run/perseusd', job='shifted', strict=True)\n"
        "    print('ok', flush=True)\n"
        "except PerseusClientError as exc:\n"
        "    print(exc.code, exc.message, flush=True)\n"
    )
    with container(
        container_daemon, [sys.executable, "-c", script], [0], tmp_path, time_offset_s=1000
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    assert line.startswith("PERMISSION_DENIED"), line
    assert "time namespace" in line


def test_a_training_job_in_a_container_registers_runs_its_plan_and_saves_energy(
    container_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The emulated training job (2 stages, one process each) in a container given host GPUs 2 and 3:
    claims, registers, reports events, gets its plan from the daemon and saves energy, as on the host."""
    daemon = container_daemon
    uuids = [row["uuid"] for row in readings.gpu_rows(daemon)]
    with container(daemon, readings.emulated_training("in-container"), [2, 3], tmp_path) as proc:
        out, err = proc.communicate(timeout=170)
    assert proc.returncode == 0, err
    report = json.loads(out)
    readings.assert_trained(report, daemon, [uuids[2], uuids[3]])
    (job,) = report["daemon_jobs"]
    assert job["plan_time_s"] <= job["all_max_time_s"] * (1 + 1e-9)

"""What the container tests (namespaces made by hand, podman) run inside a container and read back: the
client's first line, the daemon's GPU rows, and the emulated training job with the checks on its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.perseusd_proc import DaemonProcess, sim_control

CLIENT = str(Path(__file__).resolve().parent / "client_inside.py")
"""The client run inside a container (`client_inside.py CLOCK_MHZ`): claims a GPU, locks its clock."""
CLOCK_MHZ = 1005
RESTORE_TIMEOUT_S = 20.0


def first_json_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The first line `proc` prints, as JSON; a failure with its stderr if it printed none."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"the container said nothing (exit {proc.returncode}):\n{err}")
    result: dict[str, Any] = json.loads(line)
    return result


def gpu_rows(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """The daemon's GPUs as its status reports them."""
    rows: list[dict[str, Any]] = daemon.status()["gpus"]
    return rows


def emulated_training(job: str) -> list[str]:
    """perseus-emulate as job `job` against the daemon's sockets at /run/perseusd (inside a container): two
    stages of one process each, its profile imported, four iterations at time scale 0.2, a JSON report."""
    return [
        sys.executable, "-m", "perseusd.emulate.main", "--runtime-dir", "/run/perseusd",
        "--profile", "a100_sxm", "--stages", "2", "--microbatches", "4", "--time-scale", "0.2",
        "--iterations", "4", "--import-profile", "--json", "--timeout-s", "120", "--job", job,
    ]  # fmt: skip


def assert_trained(report: dict[str, Any], daemon: DaemonProcess, gpus: list[str]) -> None:
    """`emulated_training`'s report: no failure, its plan ran and saved energy, its one pipeline on `gpus`
    (the host's UUIDs); and no GPU of `daemon` is left locked once it ended."""
    assert report["failure"] is None
    assert report["plan"]["state"] == "running"
    assert report["saving_pct"] > 0
    assert [pipe["gpus"] for pipe in report["pipelines"]] == [gpus]
    for row in gpu_rows(daemon):
        assert sim_control(daemon.dirs.runtime_dir, row["uuid"]).locked_sm_clock_mhz is None

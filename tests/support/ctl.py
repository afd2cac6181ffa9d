"""`perseusctl` run as a user runs it: a subprocess against a daemon's runtime directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CTL_TIMEOUT_S = 30.0


def run_ctl(
    runtime_dir: Path, *args: str, timeout_s: float = CTL_TIMEOUT_S, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`perseusctl --runtime-dir RUNTIME_DIR ARGS...` in a fresh interpreter; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(runtime_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
    )


def assert_usage_error(out: subprocess.CompletedProcess[str], needle: str) -> None:
    """`perseusctl` refused its arguments (exit 2, `needle` on stderr) before it looked for the daemon."""
    assert out.returncode == 2
    assert needle in out.stderr
    assert "does not exist" not in out.stderr  # never got as far as the daemon's socket


def assert_unreachable(out: subprocess.CompletedProcess[str]) -> None:
    """`perseusctl` found no daemon where it was pointed: exit 2 and one line on stderr saying so."""
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "wrong runtime directory" in out.stderr


def ctl_job(runtime_dir: Path, job: str) -> dict[str, Any]:
    """Job `job` as `perseusctl jobs --json` prints it (in a subprocess: module fixtures have no capsys)."""
    out = run_ctl(runtime_dir, "jobs", "--json", check=True)
    found: dict[str, Any] = {j["job"]: j for j in json.loads(out.stdout)["jobs"]}[job]
    return found


def wait_ctl_job(
    runtime_dir: Path, job: str, ready: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """Poll `ctl_job` until `ready` holds or `timeout_s` has passed; the last reading either way (the caller
    asserts on it, so a failure shows the job as it was)."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        found = ctl_job(runtime_dir, job)
        if ready(found) or time.monotonic() > deadline_s:
            return found
        time.sleep(0.1)

"""The solve worker never outlives its daemon: `close` reaps it, and a SIGKILLed daemon's worker, forkserver
and resource tracker exit by themselves (they used to run on with no parent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perseusd.errors import PlanningError
from perseusd.jobs.solve_worker import SolveWorker

pytestmark = pytest.mark.timeout(120)

DAEMON_LIKE = """
import time
from perseusd.jobs.solve_worker import SolveWorker
worker = SolveWorker()
try:
    worker.submit(None).result()  # a bad task: the worker starts, answers with an error
except Exception:
    pass
print("ready", flush=True)
time.sleep(120)
"""


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = (Path("/proc") / entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def test_close_reaps_the_worker() -> None:
    worker = SolveWorker()
    with pytest.raises(PlanningError):
        worker.submit(None).result(timeout=60)  # type: ignore[arg-type]
    processes = list(worker._pool._processes.values())  # type: ignore[union-attr]
    assert processes
    worker.close()
    assert all(not process.is_alive() for process in processes)


def test_worker_forkserver_and_tracker_exit_when_the_daemon_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the killed process's `pymp-*` folder stays in tmp_path
    proc = subprocess.Popen([sys.executable, "-c", DAEMON_LIKE], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        helpers = _children(proc.pid)  # the resource tracker and the forkserver
        family = helpers | {pid for helper in helpers for pid in _children(helper)}  # and the worker
        assert len(family) >= 3, family
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline_s = time.monotonic() + 60
        while any(_alive(pid) for pid in family):
            assert time.monotonic() < deadline_s, f"still alive: {[p for p in family if _alive(p)]}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()

"""A job that ended, and why, is still shown after the daemon restarts, even after a SIGKILL; only to its
owner (and admins)."""

from __future__ import annotations

import json
import time

import pytest
from perseus_client.client import PerseusClient

from perseusd.daemon.past_jobs import PAST_JOBS_FILE
from tests.support.ctl import run_ctl, wait_ctl_job
from tests.support.perseusd_proc import DaemonDirs, daemon_processes

pytestmark = pytest.mark.timeout(120)


def test_an_ended_job_and_its_reason_outlive_a_killed_daemon() -> None:
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        daemon = make(dirs, gpus=2).start()
        with PerseusClient(dirs.runtime_dir, job="short", timeout_s=10.0) as client:
            assert client.daemon_info is not None
            gpu = client.daemon_info.gpus[0].uuid
            client.claim([gpu])
            client.register(gpu, stage=0, num_stages=2, num_microbatches=4)  # stage 1 never comes
            client.release([gpu])
        ended = wait_ctl_job(dirs.runtime_dir, "short", lambda job: job["state"] == "ended", 30.0)
        assert ended["state"] == "ended", ended
        assert ended["error"], ended
        deadline_s = time.monotonic() + 30.0
        while not (dirs.state_dir / PAST_JOBS_FILE).exists() and time.monotonic() < deadline_s:
            time.sleep(0.05)
        daemon.kill()  # SIGKILL: nothing written at exit

        make(dirs, gpus=2).start()
        jobs = json.loads(run_ctl(dirs.runtime_dir, "jobs", "--json", check=True).stdout)["jobs"]
        again = {job["job"]: job for job in jobs}["short"]
        assert (again["state"], again["error"]) == ("ended", ended["error"])
        assert again["state_for_s"] >= ended["state_for_s"]
        out = run_ctl(dirs.runtime_dir, "jobs", check=True).stdout
        assert "short" in out
        assert ended["error"] in out

"""`perseusctl straggler` and `PerseusClient.announce_straggler` against a real perseusd on simulated GPUs.

One process claims both GPUs and registers each as the only stage of its own pipeline (0 and 1) of a 1f1b
job, with an imported profile so that the job solves and runs at once (no events needed); the tests
announce pipeline 1 as a straggler, read `jobs`, and clear it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from perseus_client.client import PerseusClient, PerseusClientError

from perseusd.ctl.main import main
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.ctl import wait_ctl_job
from tests.support.perseusd_proc import DaemonDirs, daemon_processes
from tests.support.synthetic import synthetic_profile
from tests.support.training import daemon_gpus

pytestmark = pytest.mark.timeout(120)

JOB = "e2e-straggler"
PIPELINES = 2
WAIT_S = 60.0


@dataclass
class Daemon:
    """The running daemon's runtime directory and the registered job's client."""

    runtime_dir: Path
    client: PerseusClient


def _wait_running(runtime_dir: Path) -> dict[str, Any]:
    return wait_ctl_job(runtime_dir, JOB, lambda job: job["state"] in ("running", "failed"), WAIT_S)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with daemon_processes() as make:
        runtime_dir = make(DaemonDirs.create(), gpus=PIPELINES).start().dirs.runtime_dir
        with PerseusClient(runtime_dir, job=JOB, timeout_s=10.0, strict=True) as client:
            gpus = daemon_gpus(client)
            profile = synthetic_profile(1, seed=5, clocks_mhz=tuple(range(1410, 885, -90)))
            client.profile_import(profile_to_csv(profile), source="synthetic", p_block_w=80.0)
            client.claim(gpus)
            for pipeline, gpu in enumerate(gpus):
                client.register(gpu, stage=0, num_stages=1, num_microbatches=2, pipeline=pipeline)
            job = _wait_running(runtime_dir)
            assert job["state"] == "running", job
            yield Daemon(runtime_dir, client)


def _ctl(daemon: Daemon, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--runtime-dir", str(daemon.runtime_dir), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _job(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = _ctl(daemon, capsys, "jobs", "--json")
    assert code == 0, err
    jobs: dict[str, dict[str, Any]] = {job["job"]: job for job in json.loads(out)["jobs"]}
    return jobs[JOB]


def test_unknown_job_is_the_daemons_error_and_exit_1(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _ctl(daemon, capsys, "straggler", "nope", "--pipeline", "0", "--factor", "1.2")
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("perseusctl: error: BAD_FIELD: ")
    assert "'nope'" in err
    with pytest.raises(PerseusClientError) as info:
        daemon.client.announce_straggler(0, 1.2, job="nope")
    assert info.value.code == "BAD_FIELD"


def test_announce_shows_in_jobs_then_clears(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _ctl(daemon, capsys, "straggler", JOB, "--pipeline", "1", "--factor", "1.2")
    assert code == 0, err
    assert out == f"job {JOB}: pipeline 1 announced as a straggler (x1.20); this node only\n"
    job = _job(daemon, capsys)
    assert job["straggler"]["pipeline"] == 1
    assert job["straggler"]["factor"] == pytest.approx(1.2)
    assert job["straggler"]["source"] == "announced"
    assert job["target_time_s"] is not None
    code, out, _ = _ctl(daemon, capsys, "jobs")
    assert code == 0
    assert "straggler: pipeline 1 x1.20 (announced" in out
    marked = [line for line in out.splitlines() if line.endswith("<- straggler")]
    assert len(marked) == 1
    assert marked[0].split()[:2] == ["1", "local"]
    code, out, err = _ctl(daemon, capsys, "straggler", JOB, "--pipeline", "1", "--clear", "--json")
    assert code == 0, err
    reply = json.loads(out)
    assert (reply["job"], reply["pipeline"], reply["clear"], reply["shared"]) == (JOB, 1, True, False)
    job = _job(daemon, capsys)
    assert (job["straggler"], job["target_time_s"]) == (None, None)


def test_client_announces_for_its_own_job(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    reply = daemon.client.announce_straggler(1, 1.5)
    assert (reply.job, reply.pipeline, reply.factor, reply.clear) == (JOB, 1, 1.5, False)
    assert _job(daemon, capsys)["straggler"]["factor"] == pytest.approx(1.5)
    assert daemon.client.clear_straggler(1).clear
    assert _job(daemon, capsys)["straggler"] is None

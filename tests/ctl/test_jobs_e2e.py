"""`perseusctl jobs`, `frontier`, `plan` and `profile` against a real perseusd on simulated GPUs.

The job is driven from this process with the client library: a 2-stage profile is imported before the job
registers (so it skips profiling and goes straight to solving), both GPUs are claimed and registered as the
two stages, then a few iterations of step and computation events are sent.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from perseus_client.client import PerseusClient

from perseusd.ctl.main import main
from perseusd.planner.profile_csv import read_profile, read_profile_stream
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.training import ITERATIONS, MICROBATCHES, STAGES, WAIT_S, train_job, two_stage_profile

pytestmark = pytest.mark.timeout(120)

JOB = "e2e"
P_BLOCK_W = 80.0


@dataclass
class Ctl:
    """`perseusctl` run in this process (real sockets, real daemon): exit code, stdout, stderr."""

    runtime_dir: Path
    capsys: pytest.CaptureFixture[str]

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--runtime-dir", str(self.runtime_dir), *args])
        out = self.capsys.readouterr()
        return code, out.out, out.err

    def json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    def job(self) -> dict[str, Any]:
        jobs = {job["job"]: job for job in self.json("jobs")["jobs"]}
        return jobs[JOB]

    def wait_job(self, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline_s = time.monotonic() + WAIT_S
        while True:
            job = self.job()
            if ready(job) or time.monotonic() > deadline_s:
                return job
            time.sleep(0.05)


@pytest.fixture(scope="module")
def job_daemon() -> Iterator[Path]:
    """A daemon with a running 2-stage job that has done a few iterations; its runtime directory.

    Shared by the module's tests (one daemon start, one solve); a test that changes the job puts it back.
    """
    with daemon_processes() as make:
        daemon: DaemonProcess = make(DaemonDirs.create(), gpus=STAGES).start()
        runtime_dir = daemon.dirs.runtime_dir
        with PerseusClient(runtime_dir, job=JOB, timeout_s=10.0) as client:
            train_job(client, two_stage_profile(), MICROBATCHES, ITERATIONS, P_BLOCK_W)
            yield runtime_dir


@pytest.fixture
def running(job_daemon: Path, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(job_daemon, capsys)


def test_jobs_and_status_show_the_running_job(running: Ctl) -> None:
    job = running.job()
    assert (job["schedule"], job["num_stages"], job["num_microbatches"]) == ("1f1b", STAGES, MICROBATCHES)
    assert job["policy"] == "no_slowdown"  # the default: the least energy no slower than all-max
    assert job["frontier_points"] > 1
    assert job["plan_time_s"] <= job["all_max_time_s"] * (1 + 1e-9)
    assert job["pipelines"][0]["stages_registered"] == STAGES
    phases = ("fit_s", "frontier_s", "follow_s", "descent_s", "transfer_s")
    assert set(job["planning"]) == {"total_s", *phases}
    assert job["planning"]["total_s"] == pytest.approx(sum(job["planning"][p] for p in phases), abs=1e-5)
    code, out, _ = running("jobs")
    assert code == 0
    assert f"planned in {job['planning']['total_s']:.2f} s (fit " in out
    row = next(line for line in out.splitlines() if line.startswith(JOB))
    assert f"1f1b {STAGES}x{MICROBATCHES}" in row
    assert f"#{job['plan_index']} " in row
    pipeline_row = next(line for line in out.splitlines() if line.startswith("  0 "))
    assert pipeline_row.split()[1:4] == [
        "local",
        f"{STAGES}/{STAGES}",
        str(job["pipelines"][0]["iterations"]),
    ]
    code, out, _ = running("status")
    assert code == 0
    assert f"  pipeline 0: {STAGES}/{STAGES} stages" in out
    header = next(line for line in out.splitlines() if line.startswith("GPU  UUID"))
    assert "PLAN" in header
    assert "PCI BUS ID" in header
    assert "SIMULATED GPUs" in out.splitlines()[0]
    assert [gpu["index"] for gpu in running.json("status")["gpus"]] == list(range(STAGES))
    assert "users: uid " in out  # who uses what
    assert any(line.startswith(JOB) for line in out.splitlines())
    assert running.json("status")["jobs"][0]["job"] == JOB


def test_frontier_marks_the_deployed_point(running: Ctl, tmp_path: Path) -> None:
    job = running.job()
    doc = running.json("frontier", JOB)
    assert doc["format"] == "perseus-frontier"
    assert len(doc["points"]) == job["frontier_points"]
    code, out, err = running("frontier", JOB, "--plot", str(tmp_path / "f.png"))
    assert code == 0, err
    marked = [line for line in out.splitlines() if line.endswith("<- deployed")]
    assert len(marked) == 1
    assert marked[0].split()[0] == str(job["plan_index"])
    assert (tmp_path / "f.png").stat().st_size > 0


def test_plan_and_policies(running: Ctl) -> None:
    code, out, err = running("plan", JOB)
    assert code == 0, err
    assert f"stage {STAGES - 1}: {2 * MICROBATCHES} computations" in out
    assert "  F0@" in out
    doc = running.json("plan", JOB)
    assert doc["format"] == "perseus-plan"
    frontier = running.json("frontier", JOB)
    least = min(frontier["points"], key=lambda p: (p["refined_energy_j"], p["time_s"]))
    code, _, err = running("plan", JOB, "--policy", "min_energy")
    assert code == 0, err
    assert f"job {JOB}: policy min_energy" in err
    assert running.job()["plan_index"] == least["index"]
    assert running.json("plan", JOB)["time_s"] == least["time_s"]
    code, _, err = running("plan", JOB, "--policy", "slowdown", "--target", "5%")
    assert code == 0, err
    job = running.job()
    assert (job["policy"], job["target"]) == ("slowdown", pytest.approx(0.05))
    assert job["plan_time_s"] <= job["fastest_time_s"] * 1.05 + 1e-9
    assert running("plan", JOB, "--policy", "fastest")[0] == 0
    assert running.job()["plan_time_s"] == pytest.approx(running.job()["fastest_time_s"])


def test_profile_export_round_trips_and_import_resolves(running: Ctl, tmp_path: Path) -> None:
    code, out, err = running("profile", "export", JOB)
    assert code == 0, err
    exported = read_profile_stream(io.StringIO(out), "stdout")
    assert exported.digest() == two_stage_profile().digest()
    target = tmp_path / "exported.csv"
    code, out, err = running("profile", "export", JOB, "-o", str(target))
    assert code == 0, err
    assert f"blocking power {P_BLOCK_W:g} W" in out
    assert read_profile(target).digest() == two_stage_profile().digest()
    code, out, err = running("profile", "import", JOB, str(target), "--p-block-w", "70")
    assert code == 0, err
    assert out.startswith(
        f"imported {len(two_stage_profile().measurements)} rows from {target} into job {JOB}"
    )
    job = running.wait_job(lambda job: job["state"] == "running" and job["frontier_points"] > 0)
    assert job["state"] == "running"


@pytest.mark.parametrize(
    "args",
    [
        ("frontier", "nope"),
        ("plan", "nope"),
        ("plan", "nope", "--policy", "fastest"),
        ("profile", "export", "nope"),
    ],
)
def test_unknown_job_is_one_line_and_exit_1(running: Ctl, args: tuple[str, ...]) -> None:
    code, out, err = running(*args)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("perseusctl: error: BAD_FIELD: ")
    assert "'nope'" in err

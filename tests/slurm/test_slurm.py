"""Per-Slurm-job GPU energy against a real one-node Slurm (munged, slurmctld, slurmd started by the test):
`srun` jobs whose processes use the client library, the prolog that declares a job's GPUs, the epilog that
records the job's energy and releases what a killed job left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from perseus_client import PerseusClient
from perseus_client.protocol import AdminSlurmEpilog, SlurmJobOk
from prometheus_client.parser import text_string_to_metric_families

from perseusd.ctl.daemon_link import ask
from tests.slurm.conftest import SlurmNode
from tests.support.perseusd_proc import sim_control

pytestmark = pytest.mark.timeout(300)

JOB_CLIENT = str(Path(__file__).resolve().parent / "job_client.py")
WAIT_S = 60.0


def _ctl_json(node: SlurmNode, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "perseusd.ctl.main",
            "--runtime-dir",
            str(node.daemon.dirs.runtime_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _slurm_job(node: SlurmNode, job: int) -> dict[str, Any] | None:
    jobs = _ctl_json(node, "slurm", "jobs", "--json")["slurm_jobs"]
    return next((record for record in jobs if record["job"] == job), None)


def _wait_ended(node: SlurmNode, job: int) -> dict[str, Any]:
    deadline_s = time.monotonic() + WAIT_S
    while time.monotonic() < deadline_s:
        record = _slurm_job(node, job)
        if record is not None and record["state"] == "ended":
            return record
        time.sleep(0.2)
    raise AssertionError(f"Slurm job {job} never ended in perseusd:\n{node.cluster.log()}")


def _uuids(node: SlurmNode) -> list[str]:
    return [row["uuid"] for row in node.daemon.status()["gpus"]]


def test_an_srun_job_gets_its_gpus_and_its_energy_is_recorded(node: SlurmNode) -> None:
    uuids = _uuids(node)
    out = node.cluster.run(
        "srun", "--gres=gpu:2", "--job-name=perseus-energy", sys.executable, JOB_CLIENT,
        str(node.daemon.dirs.runtime_dir), timeout_s=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + node.cluster.log()
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    job = int(seen["job"])
    given = [uuids[int(i)] for i in seen["cuda_visible_devices"].split(",")]
    assert seen["visible"] == given  # the prolog's allocation, in the node's order
    assert seen["mine"] == given
    assert seen["other"] == "PERMISSION_DENIED"  # a GPU the job was not allocated
    record = _wait_ended(node, job)
    assert record["gpus"] == given
    assert record["source"] == ("cgroup" if node.cluster.cgroups else "environment")
    assert record["leases"] == 2
    assert record["leased_energy_j"] > 0
    assert record["allocated_energy_j"] >= record["leased_energy_j"]  # allocation spans the leases
    assert record["released_at_end"] == []
    assert record["uid"] == 0
    lines = [json.loads(line) for line in node.record.read_text().splitlines()]
    assert any(line["job"] == job and line["state"] == "ended" for line in lines)
    both = _ctl_json(node, "jobs", "--json")  # perseusctl jobs lists the Slurm jobs too
    assert any(row["job"] == job for row in both["slurm_jobs"])
    for uuid in given:
        assert sim_control(node.daemon.dirs.runtime_dir, uuid).locked_sm_clock_mhz is None
    deadline_s = time.monotonic() + WAIT_S
    while True:
        text = node.metrics.read_text() if node.metrics.exists() else ""
        values = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.labels.get("slurm_job") == str(job)
        }
        if values.get("perseus_slurm_job_running") == 0 or time.monotonic() > deadline_s:
            break
        time.sleep(0.2)
    assert values["perseus_slurm_job_leased_gpu_energy_joules"] == pytest.approx(record["leased_energy_j"])
    assert values["perseus_slurm_job_running"] == 0


def test_a_cancelled_job_gives_its_gpu_back(node: SlurmNode) -> None:
    """scancel kills the job while it holds a locked clock: the GPU is restored and the job's record ends."""
    uuids = _uuids(node)
    proc = node.cluster.popen(
        "srun", "--gres=gpu:1", "--job-name=perseus-killed", sys.executable, JOB_CLIENT,
        str(node.daemon.dirs.runtime_dir), "--hold",
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=30)[1] + node.cluster.log()
        seen = json.loads(line)
        job = int(seen["job"])
        (gpu,) = seen["mine"]
        assert sim_control(node.daemon.dirs.runtime_dir, gpu).locked_sm_clock_mhz == 1005
        assert node.cluster.run("scancel", str(job)).returncode == 0
        record = _wait_ended(node, job)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert record["gpus"] == [gpu]
    assert sim_control(node.daemon.dirs.runtime_dir, gpu).locked_sm_clock_mhz is None
    assert all(row["lease"] is None for row in node.daemon.status()["gpus"] if row["uuid"] in uuids)


def test_the_epilog_releases_what_a_job_left_leased(node: SlurmNode) -> None:
    """A process of job 990001 (by its environment) outlives the job with a lease: the epilog releases it
    and restores the GPU, and the record names it."""
    runtime_dir = node.daemon.dirs.runtime_dir
    uuids = _uuids(node)
    holder = subprocess.Popen(
        [sys.executable, "-c", LEFTOVER, str(runtime_dir), uuids[3]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"SLURM_JOB_ID": "990001", "PATH": "/usr/bin:/bin"},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        assert sim_control(runtime_dir, uuids[3]).locked_sm_clock_mhz == 1005
        record = ask(runtime_dir, AdminSlurmEpilog(job=990001), SlurmJobOk, admin=True).record
        assert record.released_at_end == (uuids[3],)
        assert record.source == "environment"
        assert record.state == "ended"
        assert sim_control(runtime_dir, uuids[3]).locked_sm_clock_mhz is None
        with PerseusClient(runtime_dir, job="after") as other:
            assert other.claim([uuids[3]]) == (uuids[3],)  # free again
    finally:
        holder.kill()
        holder.communicate(timeout=10)


LEFTOVER = """
import sys
from perseus_client import PerseusClient
client = PerseusClient(sys.argv[1], job="leftover")
client.claim([sys.argv[2]])
client.set_clock(sys.argv[2], 1005)
print("held", flush=True)
sys.stdin.readline()
"""

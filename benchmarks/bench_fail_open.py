"""The client never harms training: real 2-rank `torch.distributed.pipelining` jobs while the daemon is
absent, SIGKILLed, restarted or upgraded, RUNS times each; how many training runs failed, and how soon a
returning daemon ran the job's plan again (and whether it profiled again).

Each run is a fresh job (benchmarks/fail_open_worker.py: fail-open client, `PERSEUSD_RUNTIME_DIR`, the GPU
by UUID from `CUDA_VISIBLE_DEVICES`, the profile imported by rank 0, instrumented as docs/pytorch.md shows)
beside a perseusd on two simulated GPUs:

- absent: no daemon at all;
- killed: the job runs its plan, the daemon is SIGKILLed, training goes on to the end (release and close
  included) with no daemon;
- restarted: the job runs its plan, the daemon is SIGKILLed, a new one starts on the same directories;
- upgraded: the job runs its plan, the daemon is stopped (SIGTERM: it restores the GPUs and exits, as a
  package upgrade stops it), a new one starts (the Debian package's own upgrade under a real systemd is
  `tests/service/test_deb_package.py`).

A run fails when a rank exits non-zero or trains fewer steps than asked. For restarted and upgraded runs,
`plan_back_s` is the time from the new daemon's start (exec) to the job listed running with a plan again, and
`profiled_again` whether the new daemon profiled it (the bar: 0 failures, plan back within 5 s, no profiling).
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient, PerseusClientError
from perseus_client.job_info import JobInfo

from perseusd.gpu.sim import sim_uuid
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.synthetic import synthetic_profile

WORKER = Path(__file__).resolve().parent / "fail_open_worker.py"
SCENARIOS = ("absent", "killed", "restarted", "upgraded")
WORLD = 2
STEPS_AFTER = 15
"""Steps trained after the daemon's return (or loss), before the driver asks the job to stop."""


def _job(runtime_dir: Path, name: str) -> JobInfo | None:
    try:
        with PerseusClient(runtime_dir, job="observer", timeout_s=1.0, strict=True) as client:
            return next((job for job in client.jobs().jobs if job.job == name), None)
    except PerseusClientError:
        return None


def _wait(check: Any, timeout_s: float) -> float | None:
    """Seconds until `check()` held (polled every 20 ms), None if it never did."""
    began_s = time.monotonic()
    while time.monotonic() - began_s < timeout_s:
        if check():
            return time.monotonic() - began_s
        time.sleep(0.02)
    return None


def _steps(progress: Path) -> int:
    return len(progress.read_text().splitlines()) if progress.exists() else 0


class Run:
    """One training job (WORLD rank processes) against the daemon directories `dirs`."""

    def __init__(self, dirs: DaemonDirs, work: Path, name: str, profile: Path, max_steps: int) -> None:
        self.name, self.work = name, work
        self.stop, self.progress = work / "stop", work / "progress"
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        env["PERSEUSD_RUNTIME_DIR"] = str(dirs.runtime_dir)
        env.pop("PERSEUSD_CLIENT_STRICT", None)
        self.procs: list[tuple[subprocess.Popen[str], Path]] = []
        for rank in range(WORLD):
            config = {
                "rank": rank,
                "world": WORLD,
                "store": str(work / "store"),
                "job": name,
                "profile": str(profile),
                "stop": str(self.stop),
                "progress": str(self.progress),
                "max_steps": max_steps,
                "width": 256,
                "microbatches": 4,
            }
            out = work / f"rank{rank}.json"
            rank_env = {**env, "CUDA_VISIBLE_DEVICES": sim_uuid("a100_sxm", rank), "LOCAL_RANK": "0"}
            command = [sys.executable, str(WORKER), json.dumps(config), str(out)]
            proc = subprocess.Popen(command, env=rank_env, stderr=subprocess.PIPE, text=True)
            self.procs.append((proc, out))

    def steps(self) -> int:
        return _steps(self.progress)

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """Ask the job to stop after STEPS_AFTER more steps; its outcome."""
        target = self.steps() + STEPS_AFTER
        _wait(lambda: self.steps() >= target or any(p.poll() is not None for p, _ in self.procs), timeout_s)
        self.stop.touch()
        errors = []
        for proc, _ in self.procs:
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                errors.append(f"exit {proc.returncode}: {err[-1500:]}")
        reports = [json.loads(out.read_text()) for _, out in self.procs if out.exists()]
        return {"failed": bool(errors), "errors": errors, "steps": self.steps(), "ranks": reports}


def _profile(work: Path) -> Path:
    clocks = tuple(range(1410, 885, -90))  # the simulated A100's clocks
    path = work / "profile.csv"
    path.write_text(profile_to_csv(synthetic_profile(WORLD, seed=3, clocks_mhz=clocks)))
    return path


def run_one(scenario: str, index: int, make: Any, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"perseus-failopen-{scenario}-"))
    dirs = DaemonDirs.create()
    name = f"failopen-{scenario}-{index}"
    daemon: DaemonProcess | None = None
    if scenario != "absent":
        daemon = make(dirs, gpus=WORLD).start()
    run = Run(dirs, work, name, _profile(work), args.max_steps)
    result: dict[str, Any] = {"scenario": scenario, "run": index}
    if daemon is not None:
        running = lambda: (job := _job(dirs.runtime_dir, name)) is not None and job.state == "running"  # noqa: E731
        result["plan_s"] = _wait(running, args.timeout_s)
        _wait(lambda: run.steps() >= 5, args.timeout_s)
        daemon.signal(signal.SIGTERM if scenario == "upgraded" else signal.SIGKILL)
        daemon.wait(30)
        lost_at = run.steps()
        _wait(lambda: run.steps() >= lost_at + 5, args.timeout_s)  # trains on, unmanaged
        if scenario in ("restarted", "upgraded"):
            began_s = time.monotonic()
            daemon = make(dirs, gpus=WORLD).start(wait=False)
            back_s = _wait(running, args.timeout_s)
            result["plan_back_s"] = None if back_s is None else round(time.monotonic() - began_s, 3)
            job = _job(dirs.runtime_dir, name)
            result["cached"] = bool(job and job.cached)
            result["profiled_again"] = bool(job is None or job.profiling is not None or not job.cached)
    result.update(run.finish(args.timeout_s))
    if daemon is not None:
        daemon.stop()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(dirs.base, ignore_errors=True)
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for scenario in SCENARIOS:
        runs = [r for r in results if r["scenario"] == scenario]
        if not runs:
            continue
        backs = [r["plan_back_s"] for r in runs if r.get("plan_back_s") is not None]
        row: dict[str, Any] = {
            "runs": len(runs),
            "failed": sum(r["failed"] for r in runs),
            "steps_min": min(r["steps"] for r in runs),
        }
        if scenario in ("restarted", "upgraded"):
            row.update(
                plan_back_s_median=round(statistics.median(backs), 3) if backs else None,
                plan_back_s_max=max(backs) if backs else None,
                plan_not_back=sum(r.get("plan_back_s") is None for r in runs),
                profiled_again=sum(r.get("profiled_again", True) for r in runs),
            )
        summary[scenario] = row
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    results = []
    with daemon_processes() as make:
        for scenario in args.scenarios:
            for index in range(args.runs):
                results.append(run_one(scenario, index, make, args))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "ranks"}), file=sys.stderr)
    failures = [r for r in results if r["failed"]]
    print(json.dumps({"summary": summarize(results), "failures": failures[:5]}, indent=1))


if __name__ == "__main__":
    main()

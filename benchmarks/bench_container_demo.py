"""The README demo's job on the host and in a podman container: does a training job in a container save what
it saves on the host? Prints JSON.

Each run: a fresh perseusd on 8 simulated A100s (the demo's: `--time-scale 0.25` world, 25 ms counters,
a fresh state so the job profiles online) and the demo's emulated job, GPT-3 175B with 8 stages and 12
microbatches, 10 measured iterations, run either on the host or inside a podman container (Debian's
podman, a local image from the cached Debian root filesystem, root inside mapped to host uid 200000, the 8
GPU device nodes given, the runtime directory bind-mounted; tests/containers/podman.py). Host and
container runs alternate (`--rounds` of each), so both see the same machine; the summary gives each
placement's savings and slowdowns, their means and the difference of the means against the spread between
runs of one placement.

    python benchmarks/bench_container_demo.py [--rounds 2] [--iterations 10] [--time-scale 0.25]

Needs root and podman (as the container tests do).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.containers.conftest import open_simulated_boards
from tests.containers.podman import Podman, device_nodes, missing_requirement, podman_storage
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

GPUS = 8
JOB_TIMEOUT_S = 900


def emulate_args(args: argparse.Namespace, runtime_dir: str) -> list[str]:
    return [
        "-m", "perseusd.emulate.main", "--runtime-dir", runtime_dir,
        "--profile", "a100_sxm", "--stages", "8", "--microbatches", "12",
        "--iterations", str(args.iterations), "--time-scale", str(args.time_scale),
        "--job", "demo-gpt3", "--json", "--timeout-s", str(JOB_TIMEOUT_S - 60),
    ]  # fmt: skip


def run_once(placement: str, args: argparse.Namespace, podman: Podman, scratch: Path) -> dict[str, Any]:
    dirs = DaemonDirs.create()
    env = {"PERSEUSD_SOCKET_GROUP": "nogroup", "PERSEUSD_SIM_UPDATE_PERIOD_S": str(0.1 * args.time_scale)}
    daemon = DaemonProcess(dirs, gpus=GPUS, env=env, extra_args=("--sim-model", "a100_sxm")).start()
    try:
        open_simulated_boards(daemon)
        if placement == "host":
            command = [sys.executable, *emulate_args(args, str(dirs.runtime_dir))]
            out = subprocess.run(command, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False)
            stdout, stderr, code = out.stdout, out.stderr, out.returncode
        else:
            nodes = device_nodes(scratch / f"dev-{os.getpid()}", list(range(GPUS)))
            command = [sys.executable, *emulate_args(args, "/run/perseusd")]
            container, attached = podman.start(command, dirs.runtime_dir, nodes)
            try:
                stdout, stderr = attached.communicate(timeout=JOB_TIMEOUT_S)
                code = attached.returncode
            finally:
                podman.remove(container)
        if code != 0:
            raise RuntimeError(f"{placement} run failed ({code}): {stderr[-2000:]}")
        report: dict[str, Any] = json.loads(stdout)
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", str(dirs.base)], check=False)
    plan = report["plan"]
    return {
        "placement": placement,
        "saving_pct": report["saving_pct"],
        "slowdown_pct": report["slowdown_pct"],
        "profiling_iterations": report["profiling"]["iterations"],
        "baseline_energy_per_iteration_j": report["baseline"]["energy_per_iteration_j"],
        "optimized_energy_per_iteration_j": report["optimized"]["energy_per_iteration_j"],
        "plan_index": plan["plan_index"],
        "wrong_clock_fraction": plan.get("wrong_clock_fraction"),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for placement in ("host", "container"):
        savings = [r["saving_pct"] for r in runs if r["placement"] == placement]
        slowdowns = [r["slowdown_pct"] for r in runs if r["placement"] == placement]
        out[placement] = {
            "saving_pct": savings,
            "saving_mean_pct": statistics.fmean(savings),
            "saving_spread_pct": max(savings) - min(savings),
            "slowdown_pct": slowdowns,
            "slowdown_mean_pct": statistics.fmean(slowdowns),
        }
    out["saving_difference_pct"] = out["container"]["saving_mean_pct"] - out["host"]["saving_mean_pct"]
    out["host_spread_pct"] = out["host"]["saving_spread_pct"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--time-scale", type=float, default=0.25)
    args = parser.parse_args()
    reason = missing_requirement()
    if reason:
        print(json.dumps({"skipped": reason}))
        return 1
    runs = []
    with podman_storage() as podman, tempfile.TemporaryDirectory(prefix="perseus-bench-") as scratch:
        for _ in range(args.rounds):
            for placement in ("host", "container"):
                runs.append(run_once(placement, args, podman, Path(scratch)))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"runs": runs, "summary": summarize(runs), "load": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

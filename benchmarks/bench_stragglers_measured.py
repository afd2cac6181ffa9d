"""A straggler measured end to end on two nodes: a real 3-member etcd cluster, two daemons, `perseus-emulate`.

Two `perseusd --backend sim --sim-model a100_sxm --sim-gpus 16` (nodes node-a and node-b, sharing the job
through etcd) run GPT-3 175B as 4 data-parallel pipelines x 8 stages x 12 microbatches, pipelines 0-1 on
node-a and 2-3 on node-b, synced at every iteration's end (the gradient all-reduce). Pipeline 0 straggles by
1.2 in the baseline (all-max clocks under the same straggler) and from the moment the job runs; the daemons
detect it, share it, and move the healthy pipelines to slower, cheaper plans. Prints one JSON object: the
job's saving and slowdown against that baseline, each pipeline's numbers, the healthy pipelines' compute time
relative to the straggler's, and the reaction (each pipeline's `plan_since_step` minus the straggler's
`since_step`). `--no-cluster` runs the same job on one daemon with 32 GPUs and no etcd, for comparison.

The profile is imported (online profiling is measured by bench_closed_loop.py; `--online-profiling` turns it
on here). Nothing is timed against a threshold: the numbers are reported, never turned into pass/fail.

    python benchmarks/bench_stragglers_measured.py [--no-cluster] [--online-profiling] [--time-scale 0.5]
        [--straggler 0:1.2] [--iterations 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.etcd_cluster import EtcdCluster  # noqa: E402
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes  # noqa: E402

MODEL = "a100_sxm"
NODES = ("node-a", "node-b")
EMULATE_TIMEOUT_S = 3600


def _cluster_env(endpoints: tuple[str, ...], node: str) -> dict[str, str]:
    return {
        "PERSEUSD_ETCD_ENDPOINTS": ",".join(endpoints),
        "PERSEUSD_CLUSTER_NODE_NAME": node,
        "PERSEUSD_CLUSTER_REFRESH_INTERVAL_S": "0.2",
    }


@contextlib.contextmanager
def _daemons(args: argparse.Namespace) -> Iterator[list[DaemonProcess]]:
    """Two daemons sharing an etcd cluster, or one daemon with every GPU (`--no-cluster`)."""
    gpus = args.stages * args.pipelines
    extra = ("--sim-model", MODEL)
    with contextlib.ExitStack() as stack, daemon_processes() as make:  # daemons stop before etcd
        if args.no_cluster:
            daemons = [make(DaemonDirs.create(), gpus=gpus, extra_args=extra)]
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perseus-etcd-")))
            etcd = EtcdCluster(base)
            stack.callback(etcd.close)
            etcd.start()
            env = {node: _cluster_env(etcd.endpoints, node) for node in NODES}
            daemons = [make(DaemonDirs.create(), gpus=gpus // 2, extra_args=extra, env=env[n]) for n in NODES]
        try:
            yield [daemon.start() for daemon in daemons]
        finally:
            _stop(daemons)


def _stop(daemons: list[DaemonProcess]) -> None:
    """SIGTERM, so each daemon ends its solver workers (SIGKILL, the fallback, may leave them behind)."""
    for daemon in daemons:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait()


def _emulate(args: argparse.Namespace, daemons: list[DaemonProcess], json_path: Path) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "perseusd.emulate.main",
        "--profile", MODEL, "--stages", str(args.stages), "--microbatches", str(args.microbatches),
        "--pipelines", str(args.pipelines), "--iterations", str(args.iterations),
        "--time-scale", str(args.time_scale), "--straggler", args.straggler,
        "--json-file", str(json_path), "--timeout-s", str(EMULATE_TIMEOUT_S),
    ]  # fmt: skip
    for daemon in daemons:
        command += ["--runtime-dir", str(daemon.dirs.runtime_dir)]
    if not args.online_profiling:
        command.append("--import-profile")
    if args.dry_run:
        return {"command": command}
    out = subprocess.run(command, capture_output=True, text=True, check=False, timeout=EMULATE_TIMEOUT_S + 60)
    if not json_path.exists():
        return {"error": out.stderr.strip()[-2000:]}
    result: dict[str, Any] = json.loads(json_path.read_text())
    return result


def _pipeline_infos(daemon_jobs: list[Mapping[str, Any] | None]) -> dict[int, Mapping[str, Any]]:
    """Each pipeline as the daemon that runs it reports it (node "" is the reporting daemon's own)."""
    infos: dict[int, Mapping[str, Any]] = {}
    for job in daemon_jobs:
        for pipeline in job["pipelines"] if job else ():
            if pipeline["node"] == "" or pipeline["pipeline"] not in infos:
                infos[pipeline["pipeline"]] = pipeline
    return infos


def _straggler_since(daemon_jobs: list[Mapping[str, Any] | None]) -> int | None:
    steps = [job["straggler"]["since_step"] for job in daemon_jobs if job and job["straggler"]]
    return min(steps) if steps else None


def _reaction(pipeline: int, straggler: int, plan_since: int | None, since: int | None) -> int | None:
    """Steps from the straggler's detection to a healthy pipeline's new plan (the straggler keeps its own)."""
    if pipeline == straggler or plan_since is None or since is None:
        return None
    return plan_since - since


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def summarize(result: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the benchmark reports, from the emulator's JSON."""
    straggler = result["straggler"]["pipeline"]
    infos = _pipeline_infos(result["daemon_jobs"])
    since = _straggler_since(result["daemon_jobs"])
    straggler_compute_s = infos.get(straggler, {}).get("compute_time_s")
    straggler_optimized = result["pipelines"][straggler]["optimized"] or {}
    pipelines = []
    for row in result["pipelines"]:
        info = infos.get(row["pipeline"], {})
        plan_since = info.get("plan_since_step")
        pipelines.append(
            {
                **row,
                "node_reported": info.get("node"),
                "plan_index": info.get("plan_index"),
                "slowness": info.get("slowness"),
                "compute_time_s": info.get("compute_time_s"),
                "compute_time_vs_straggler": _ratio(info.get("compute_time_s"), straggler_compute_s),
                "reaction_steps": _reaction(row["pipeline"], straggler, plan_since, since),
            }
        )
    optimized = result["optimized"] or {}
    return {
        "saving_pct": result["saving_pct"],
        "slowdown_pct": result["slowdown_pct"],
        "optimized_time_vs_straggler": _ratio(
            optimized.get("iteration_time_s"), straggler_optimized.get("iteration_time_s")
        ),
        "straggler_detected": [job["straggler"] if job else None for job in result["daemon_jobs"]],
        "straggler_since_step": since,
        "running_iteration": result["running_iteration"],
        "baseline": result["baseline"],
        "optimized": result["optimized"],
        "plan": result["plan"],
        "pipelines": pipelines,
        "iteration_times_s": [
            [row["iteration"], row["phase"], round(row["time_s"], 4)] for row in result["iterations"]
        ],
        "failure": result["failure"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--no-cluster", action="store_true", help="one daemon with every GPU, no etcd")
    parser.add_argument(
        "--online-profiling", action="store_true", help="profile online (no --import-profile)"
    )
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--straggler", default="0:1.2", help="PIPELINE:FACTOR[:FROM[:TO]] (default 0:1.2)")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=12)
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--dry-run", action="store_true", help="start everything, print the emulator command")
    args = parser.parse_args()
    started_s = time.monotonic()
    with _daemons(args) as daemons, tempfile.TemporaryDirectory(prefix="perseus-bench-") as out_dir:
        result = _emulate(args, daemons, Path(out_dir) / "emulate.json")
    document: dict[str, Any] = {
        "benchmark": "stragglers_measured",
        "mode": "one daemon" if args.no_cluster else "two daemons, 3-member etcd cluster",
        "model": MODEL,
        "stages": args.stages,
        "microbatches": args.microbatches,
        "num_pipelines": args.pipelines,
        "straggler": args.straggler,
        "time_scale": args.time_scale,
        "profiling": "online" if args.online_profiling else "imported",
        "wall_s": round(time.monotonic() - started_s, 1),
    }
    if "straggler" not in result:
        print(json.dumps({**document, **result}, indent=2))
        return 0 if args.dry_run else 1
    print(json.dumps({**document, **summarize(result)}, indent=2))
    return 0 if result["failure"] is None else 1


if __name__ == "__main__":
    sys.exit(main())

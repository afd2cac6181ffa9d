"""Pipelines that span nodes, measured end to end: several daemons sharing a real 3-member etcd, against the
same job on one daemon in the same invocation; prints JSON.

Each case runs `perseus-emulate` twice, each run with its own all-max baseline measured in that run (from the
simulated GPUs' energy counters): once on one daemon without etcd (the reference), once with the job's stages
spread over D daemons (stand-ins for nodes, each with its own runtime directory and simulated GPUs) that share
a loopback etcd cluster of three members (at etcd's default heartbeat and election timeout; the plane at its
default 0.5 s round, lease TTL 6 s). Cases:

- `gpt3-tp2-8d`: GPT-3 175B on the A100 board, 8 stages x 12 microbatches, 8 daemons, 2 tensor-parallel GPUs
  per stage (reference: the same job on one daemon with one GPU per stage, the README's 15.1-15.2 %);
- `h100x8-4d`, `h100x8-2d`: the shipped H100 GPT profile, 4 stages x 8 microbatches, on 4 daemons (one stage
  each) and on 2 daemons (two stages each);
- `h100-dp4-straggler`: 4 data-parallel pipelines of 4 stages (H100 GPT, 8 microbatches), stage s of every
  pipeline on daemon s, pipeline 0 throttled x1.2 in the baseline and from the moment the job runs.

`--kill NODE|leader|follower` SIGKILLs daemon NODE (0 is the first), the job's leader or a node that does
not lead it, `--kill-after` iterations into the spanning run's
optimized window, then does what systemd does for the unit (`perseusd reset`: its GPUs put back) and starts
it again after `--restart-after-s`: the window measures the slowdown over the iterations that follow; the
result says whether every simulated GPU of every daemon is unlocked at the end.

Per run: the saving and slowdown against its own baseline, profiling iterations, how many times the job was
solved (every node's `span.solves`), the plan, and for the spanning run the closed-loop bars of
`bench_closed_loop.py` and the difference to the reference in points.

    python benchmarks/bench_spanning.py [--cases gpt3-tp2-8d,h100x8-4d,...] [--time-scale 1.0]
        [--iterations 8] [--no-reference] [--kill 1 --kill-after 2 --iterations 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_closed_loop import references, summary  # noqa: E402
from tests.support import etcd_cluster, perseusd_proc  # noqa: E402
from tests.support.etcd_cluster import EtcdCluster  # noqa: E402
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes, sim_control  # noqa: E402

perseusd_proc.READY_TIMEOUT_S = 120.0
etcd_cluster.HEARTBEAT_MS, etcd_cluster.ELECTION_MS = 100, 1000  # etcd's defaults: the tests' 50/500 ms
# elect faster but keep 3 members busy on a 2-core machine
EMULATE_TIMEOUT_S = 3600
TTL_S = 6


@dataclass(frozen=True)
class Case:
    board: str
    profile: str
    stages: int
    microbatches: int
    daemons: int
    tensor_parallel: int = 1
    pipelines: int = 1
    straggler: str | None = None
    reference_tensor_parallel: int = 1
    settle_iterations: int | None = None
    """Iterations between the job running and the optimized window (None: the emulator's default)."""
    closed_loop_case: str | None = None
    """The `bench_closed_loop.py` case whose references (the planner's no-slowdown saving) apply."""


CASES = {
    "gpt3-tp2-8d": Case("a100_sxm", "a100_sxm", 8, 12, 8, tensor_parallel=2, closed_loop_case="a100x12"),
    "gpt3-tp2-1d": Case("a100_sxm", "a100_sxm", 8, 12, 1, tensor_parallel=2, closed_loop_case="a100x12"),
    "h100x8-4d": Case("h100_sxm", "h100_sxm", 4, 8, 4, closed_loop_case="h100x8"),
    "h100x8-2d": Case("h100_sxm", "h100_sxm", 4, 8, 2, closed_loop_case="h100x8"),
    "h100-dp4-straggler": Case(
        "h100_sxm", "h100_sxm", 4, 8, 4, pipelines=4, straggler="0:1.2", settle_iterations=24
    ),
}


def _env(args: argparse.Namespace, endpoints: tuple[str, ...] = (), node: str = "") -> dict[str, str]:
    env = {"PERSEUSD_SIM_UPDATE_PERIOD_S": str(0.1 * args.time_scale), "PERSEUSD_JOB_CACHE": "false"}
    if endpoints:
        env |= {
            "PERSEUSD_ETCD_ENDPOINTS": ",".join(endpoints),
            "PERSEUSD_CLUSTER_NODE_NAME": node,
            "PERSEUSD_CLUSTER_LEASE_TTL_S": str(TTL_S),
            "PERSEUSD_CLUSTER_REFRESH_INTERVAL_S": "0.5",  # the default
        }
    return env


@contextlib.contextmanager
def _cluster(case: Case, args: argparse.Namespace, spanning: bool) -> Iterator[list[DaemonProcess]]:
    """The daemons of one run: D sharing a fresh etcd cluster, or one alone."""
    stages = case.stages * case.pipelines
    with contextlib.ExitStack() as stack, daemon_processes() as make:  # daemons stop before etcd
        extra = ("--sim-model", case.board)
        if not spanning:
            gpus = stages * case.reference_tensor_parallel
            daemons = [make(DaemonDirs.create(), gpus=gpus, extra_args=extra, env=_env(args))]
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perseus-etcd-")))
            etcd = EtcdCluster(base)
            stack.callback(etcd.close)
            etcd.start()
            gpus = -(-stages // case.daemons) * case.tensor_parallel
            daemons = [
                make(
                    DaemonDirs.create(),
                    gpus=gpus,
                    extra_args=extra,
                    env=_env(args, etcd.endpoints, f"node-{i}"),
                )
                for i in range(case.daemons)
            ]
        for daemon in daemons:
            daemon.start()
        yield daemons


def _command(case: Case, args: argparse.Namespace, daemons: list[DaemonProcess], spanning: bool) -> list[str]:
    settle = []
    if args.kill is not None and spanning:
        settle = ["--settle-iterations", str(args.settle_iterations)]
    elif case.settle_iterations is not None:  # the straggler detected and planned for on every node first
        settle = ["--settle-iterations", str(case.settle_iterations)]
    command = [
        sys.executable, "-m", "perseusd.emulate.main",
        "--profile", case.profile, "--stages", str(case.stages), "--microbatches", str(case.microbatches),
        "--pipelines", str(case.pipelines), "--iterations", str(args.iterations),
        "--time-scale", str(args.time_scale), "--timeout-s", str(EMULATE_TIMEOUT_S), "--json", *settle,
        "--tensor-parallel", str(case.tensor_parallel if spanning else case.reference_tensor_parallel),
        "--placement", "stages" if spanning else "pipelines",
    ]  # fmt: skip
    if case.straggler:
        command += ["--straggler", case.straggler]
    for daemon in daemons:
        command += ["--runtime-dir", str(daemon.dirs.runtime_dir)]
    return command


class Killer:
    """Watches the emulator's progress lines; SIGKILLs a daemon inside the optimized window, resets its GPUs
    as systemd's ExecStopPost would, and starts it again."""

    def __init__(self, daemons: list[DaemonProcess], which: str, args: argparse.Namespace) -> None:
        self._daemons, self._which = daemons, which
        self._after, self._settle = args.kill_after, args.settle_iterations
        self._restart_after_s = args.restart_after_s
        self.events: dict[str, Any] = {}

    def _victim(self) -> int:
        """The daemon to kill: an index, the job's leader, or a node that does not lead it."""
        if self._which.isdigit():
            return int(self._which)
        leader = _leader(self._daemons[0])
        index = int(leader.removeprefix("node-")) if leader.startswith("node-") else 0
        if self._which == "leader":
            return index
        return max(i for i in range(len(self._daemons)) if i != index)

    def watch(self, stream: Any, lines: list[str]) -> None:
        running = 0
        for line in stream:
            lines.append(line)
            if " running " not in line or "kill_iteration" in self.events:
                continue
            running += 1
            if running >= self._settle + self._after:
                self.events["kill_iteration"] = int(line.split()[0]) + 1
                threading.Thread(target=self._kill_and_restart, daemon=True).start()

    def _kill_and_restart(self) -> None:
        victim = self._victim()
        self.events["daemon"] = victim
        daemon = self._daemons[victim]
        daemon.signal(signal.SIGKILL)
        daemon.wait()
        killed_s = time.monotonic()
        reset = subprocess.run(
            [*daemon.command(), "reset"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        self.events["reset_rc"] = reset.returncode
        self.events["reset_done_after_s"] = round(time.monotonic() - killed_s, 2)
        time.sleep(max(0.0, self._restart_after_s - (time.monotonic() - killed_s)))
        daemon.start()
        self.events["restarted_after_s"] = round(time.monotonic() - killed_s, 2)


def _run(case: Case, args: argparse.Namespace, spanning: bool) -> dict[str, Any]:
    with _cluster(case, args, spanning) as daemons:
        command = _command(case, args, daemons, spanning)
        started_s = time.monotonic()
        killer = Killer(daemons, args.kill, args) if spanning and args.kill is not None else None
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        watcher = threading.Thread(
            target=(killer.watch if killer else _drain), args=(proc.stderr, lines), daemon=True
        )
        watcher.start()
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=EMULATE_TIMEOUT_S + 60)
        watcher.join(10)
        wall_s = round(time.monotonic() - started_s, 1)
        if proc.returncode != 0:
            return {"error": "".join(lines)[-3000:], "wall_s": wall_s}
        result: dict[str, Any] = json.loads(out)
        time.sleep(2.0)  # the stages released their GPUs; each daemon restores them
        locked = [
            f"d{i}/{gpu['uuid']}"
            for i, daemon in enumerate(daemons)
            for gpu in daemon.status()["gpus"]
            if sim_control(daemon.dirs.runtime_dir, gpu["uuid"]).locked_sm_clock_mhz is not None
        ]
        extra = {"kill": {"which": args.kill, **killer.events}} if killer else {}
        return {"wall_s": wall_s, "gpus_left_locked": locked, **extra, **result}


def _leader(daemon: DaemonProcess) -> str:
    """The node that leads the (only) job, as `perseusctl jobs --json` on `daemon` says ("" if none)."""
    command = [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(daemon.dirs.runtime_dir)]
    out = subprocess.run(
        [*command, "jobs", "--json"], capture_output=True, text=True, check=False, timeout=60
    )
    jobs = json.loads(out.stdout or "{}").get("jobs") or [{}]
    return str((jobs[0].get("span") or {}).get("leader") or "")


def _drain(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def _solves(result: dict[str, Any]) -> list[int | None]:
    return [(job.get("span") or {}).get("solves") if job else None for job in result.get("daemon_jobs") or []]


def _figures(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    if "error" in result:
        return result
    reference = references(case.closed_loop_case) if case.closed_loop_case else None
    figures = summary(result, reference)
    figures["solves"] = _solves(result)
    figures["profiling"] = result.get("profiling")
    jobs = result.get("daemon_jobs") or []
    figures["daemon_profiling_iterations"] = [
        (job.get("profiling") or {}).get("iterations") if job else None for job in jobs
    ]
    figures["daemon_plans"] = [
        None
        if not job
        else {
            "state": job.get("state"),
            "plan_index": job.get("plan_index"),
            "plan_epoch": (job.get("span") or {}).get("plan_epoch"),
            "leader": (job.get("span") or {}).get("leader"),
            "wrong_clock_fraction": job.get("wrong_clock_fraction"),
            "clock_changes_per_iteration": job.get("clock_changes_per_iteration"),
        }
        for job in jobs
    ]
    figures["gpus_left_locked"] = result["gpus_left_locked"]
    figures["wall_s"] = result["wall_s"]
    if "kill" in result:
        figures["kill"] = result["kill"]
    figures["per_pipeline"] = [
        {
            "pipeline": p["pipeline"],
            "daemons": p.get("stage_daemons"),
            "baseline_s": (p["baseline"] or {}).get("iteration_time_s"),
            "optimized_s": (p["optimized"] or {}).get("iteration_time_s"),
            "baseline_j": (p["baseline"] or {}).get("energy_per_iteration_j"),
            "optimized_j": (p["optimized"] or {}).get("energy_per_iteration_j"),
        }
        for p in result.get("pipelines", [])
    ]
    return figures


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    case = CASES[name]
    document: dict[str, Any] = {"case": name, **case.__dict__, "time_scale": args.time_scale}
    if not args.no_reference:
        document["one_daemon"] = _figures(case, _run(case, args, spanning=False))
    document["spanning"] = _figures(case, _run(case, args, spanning=True))
    one, spread = document.get("one_daemon", {}), document["spanning"]
    if one.get("measured_saving_pct") is not None and spread.get("measured_saving_pct") is not None:
        document["saving_difference_points"] = round(
            spread["measured_saving_pct"] - one["measured_saving_pct"], 2
        )
    return document


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--no-reference", action="store_true", help="skip the one-daemon run")
    parser.add_argument(
        "--kill",
        help="SIGKILL a daemon inside the optimized window: its index, `leader` (the job's solving node) or "
        "`follower` (a node that does not lead the job)",
    )
    parser.add_argument("--kill-after", type=int, default=2, help="iterations into the window (default 2)")
    parser.add_argument("--settle-iterations", type=int, default=4, help="with --kill (default 4)")
    parser.add_argument("--restart-after-s", type=float, default=5.0, help="with --kill (default 5)")
    args = parser.parse_args()
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}: one of {', '.join(CASES)}")
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    results = [run_case(name, args) for name in names]
    print(json.dumps({"benchmark": "spanning", "load_before": load, "results": results}, indent=2))
    return 0 if all("error" not in r.get("spanning", {}) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

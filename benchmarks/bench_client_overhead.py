"""What the Perseus integration costs a real training job: step time with and without it, and where it goes.

A `torch.distributed.pipelining` 1F1B job on CPU (gloo, one thread per rank, steps of about 50-200 ms) runs
with 2 and 4 ranks beside a perseusd on as many simulated GPUs. Each rank trains blocks of steps alternately
without the integration (no client call: the daemon has no job) and with it (claim, `instrument`, steps,
close, release: the daemon runs the job's plan from its cache and switches clocks per computation), the order
flipped every round (benchmarks/overhead_worker.py). Reported per world size:

- step time (rank 0's median) off and on, and the overhead: of the medians, and the median of each round's
  paired difference (the bar: at most 1 %);
- the integration's own time per reported computation in the training process (a wrapped no-op sending its
  begin and end; the bar: at most 20 us), and with --profile-client a cProfile of one more "on" block
  restricted to the client library's functions (where the training process's share goes);
- the daemon's CPU use during off and on blocks (% of one core), by thread (from /proc: the IPC loop, the GPU
  owner threads, the energy sampler, the deadline timer), so what the daemon takes from the cores training
  uses is seen, not guessed; and per event read in the "on" blocks (benchmarks/bench_event_cost.py measures
  that alone, against another checkout).

`--transports seqpacket seqpacket-uncarried zmq` runs each world size once per event transport, each with its
own daemon, one after the other in the same run: protocol 6.11's SOCK_SEQPACKET socket with carried events
(the default), the same socket with every event sent at once (`carry_events = false`, as 6.10) and ZeroMQ's
event socket (`seqpacket_events = false`, as before 6.10).

Run timing-sensitive: `flock /tmp/perseus-bench.lock python benchmarks/bench_client_overhead.py`; the
machine's load is printed beside the numbers. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient

from benchmarks.processes import cpu_s_by_thread_name
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.synthetic import synthetic_profile

WORKER = Path(__file__).resolve().parent / "overhead_worker.py"
TRANSPORT_ENV: dict[str, dict[str, str]] = {
    "seqpacket": {},
    "seqpacket-uncarried": {"PERSEUSD_CARRY_EVENTS": "false"},
    "zmq": {"PERSEUSD_SEQPACKET_EVENTS": "false"},
}
"""The daemon's environment for each event transport."""


class ThreadCpu:
    """Samples a process's per-thread CPU time (/proc/PID/task/*/stat) on a background thread."""

    def __init__(self, pid: int, period_s: float = 0.2) -> None:
        self.pid = pid
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.names: dict[int, str] = {}
        self.python_names()  # before the first sample: a thread keeps one name throughout
        self._stop = threading.Event()
        self._period_s = period_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def python_names(self) -> None:
        """Python's thread names (the OS shows "python" for every Python thread), from a `py-spy dump` where
        py-spy is installed (`pip install py-spy`); ZeroMQ's own threads keep their OS names."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        try:
            out = subprocess.run(
                [spy, "dump", "--pid", str(self.pid)], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return
        for tid, name in re.findall(r'^Thread (\d+) \(\w+\): "([^"]+)"', out.stdout, re.MULTILINE):
            self.names[int(tid)] = name

    def read(self) -> dict[str, float]:
        """CPU seconds by thread name (threads of one name summed)."""
        return cpu_s_by_thread_name(self.pid, self.names)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.read()))
            self._stop.wait(self._period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, began_s: float, ended_s: float) -> dict[str, float]:
        """CPU seconds per thread name used between two wall times (nearest samples inside)."""
        inside = [(t, cpu) for t, cpu in self.samples if began_s <= t <= ended_s]
        if len(inside) < 2:
            return {}
        (t0, first), (t1, last) = inside[0], inside[-1]
        return {name: last.get(name, 0.0) - first.get(name, 0.0) for name in last} | {"_wall_s": t1 - t0}


def _pct(seconds: float, wall_s: float) -> float:
    return round(100.0 * seconds / wall_s, 2) if wall_s > 0 else 0.0


def _daemon_cpu(cpu: ThreadCpu, blocks: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """The daemon's CPU (% of one core) during the blocks of `mode`, in total and by thread."""
    used: dict[str, float] = {}
    for block in blocks:
        if block["mode"] != mode:
            continue
        for name, seconds in cpu.between(*block["wall_s"]).items():
            used[name] = used.get(name, 0.0) + seconds
    wall_s = used.pop("_wall_s", 0.0)
    by_thread = {name: _pct(seconds, wall_s) for name, seconds in sorted(used.items(), key=lambda kv: -kv[1])}
    return {
        "total_pct": _pct(sum(used.values()), wall_s),
        **{f"thread {k}": v for k, v in by_thread.items() if v},
    }


def _rank_threads(blocks: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """Rank 0's process in the blocks of `mode`: its other threads' CPU (% of one core) and how often per
    step its training thread was preempted."""
    chosen = [b for b in blocks if b["mode"] == mode]
    wall_s = sum(b["wall_s"][1] - b["wall_s"][0] for b in chosen)
    steps = sum(len(b["step_s"]) for b in chosen)
    return {
        "other_threads_pct": _pct(sum(b["other_threads_cpu_s"] for b in chosen), wall_s),
        "preemptions_per_step": round(sum(b["main_preempted"] for b in chosen) / max(1, steps), 1),
    }


def _run_world(args: argparse.Namespace, world: int, daemon: DaemonProcess, work: Path) -> dict[str, Any]:
    with PerseusClient(daemon.dirs.runtime_dir, job="clocks", strict=True) as client:
        assert client.daemon_info is not None
        clocks = tuple(client.daemon_info.gpus[0].supported_sm_clocks_mhz[:10:9])
        simulated = ",".join(gpu.uuid for gpu in client.daemon_info.gpus)
    profile = work / "profile.csv"
    profile.write_text(profile_to_csv(synthetic_profile(world, seed=5, clocks_mhz=clocks)))
    base = {
        "world": world,
        "store": str(work / "store"),
        "runtime_dir": str(daemon.dirs.runtime_dir),
        "job": f"overhead-{world}",
        "profile": str(profile),
        "profile_client": args.profile_client,
        "modes": args.modes,
        **{
            key: getattr(args, key)
            for key in ("rounds", "steps", "warmup", "width", "layers", "microbatches", "rows")
        },
    }
    # Each rank's device is its simulated GPU, named by UUID as Kubernetes and Slurm name GPUs: torch sees no
    # CUDA device (on a GPU machine too), and the client finds the rank's GPU by LOCAL_RANK in that list.
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": simulated,
    }
    assert daemon.proc is not None
    cpu = ThreadCpu(daemon.proc.pid)
    procs = []
    for rank in range(world):
        out = work / f"rank{rank}.json"
        command = [sys.executable, str(WORKER), json.dumps({**base, "rank": rank}), str(out)]
        rank_env = {**env, "LOCAL_RANK": str(rank)}
        procs.append((subprocess.Popen(command, env=rank_env, stderr=subprocess.PIPE, text=True), out))
    try:
        for proc, _ in procs:
            _, err = proc.communicate(timeout=args.timeout_s)
            assert proc.returncode == 0, err[-4000:]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        cpu.stop()
    report = json.loads(procs[0][1].read_text())
    return _summary(report, cpu, world, args.microbatches, args.warmup)


def _per_event_us(
    daemon_pct: float, blocks: list[dict[str, Any]], world: int, microbatches: int, warmup: int
) -> float:
    """The daemon's CPU per event read during the "on" blocks (us): each rank sends a step's begin and end and
    a begin and an end per forward and backward, warm-up steps included."""
    chosen = [b for b in blocks if b["mode"] == "on"]
    wall_s = sum(b["wall_s"][1] - b["wall_s"][0] for b in chosen)
    events = world * (2 + 4 * microbatches) * sum(len(b["step_s"]) + warmup for b in chosen)
    per_event_us: float = daemon_pct / 100 * wall_s / max(1, events) * 1e6
    return round(per_event_us, 1)


def _summary(
    report: dict[str, Any], cpu: ThreadCpu, world: int, microbatches: int, warmup: int
) -> dict[str, Any]:
    blocks = report["blocks"]
    modes = sorted({b["mode"] for b in blocks}, key=["off", "hooks", "sent", "on"].index)
    medians = {mode: [statistics.median(b["step_s"]) for b in blocks if b["mode"] == mode] for mode in modes}
    off_s, on_s = statistics.median(medians["off"]), statistics.median(medians["on"])
    paired = [(on - off) / off for off, on in zip(medians["off"], medians["on"], strict=True)]
    per_step_computations = 2 * microbatches
    daemon_on = _daemon_cpu(cpu, blocks, "on")
    return {
        "ranks": world,
        "step_ms": {"off": round(off_s * 1e3, 2), "on": round(on_s * 1e3, 2)},
        "overhead_pct": round(100 * (on_s - off_s) / off_s, 2),
        "paired_overhead_pct": {
            "median": round(100 * statistics.median(paired), 2),
            "rounds": [round(100 * value, 2) for value in paired],
        },
        "block_median_step_ms": {
            mode: [round(v * 1e3, 1) for v in values] for mode, values in medians.items()
        },
        "step_ms_by_mode": {
            mode: round(statistics.median(values) * 1e3, 2) for mode, values in medians.items()
        },
        "daemon_cpu_by_mode": {mode: _daemon_cpu(cpu, blocks, mode)["total_pct"] for mode in modes},
        "rank0_by_mode": {mode: _rank_threads(blocks, mode) for mode in modes},
        "computation_us": round(report["computation_us"], 2),
        "daemon_cpu_off": _daemon_cpu(cpu, blocks, "off"),
        "daemon_cpu_on": daemon_on,
        "daemon_us_per_event_on": _per_event_us(daemon_on["total_pct"], blocks, world, microbatches, warmup),
        "client_profile": report.get("client_profile"),
        "events_sent": report["events_sent"],
        "events_carried": report["events_carried"],
        "events_dropped": report["events_dropped"],
        "calls_skipped": report["calls_skipped"],
        "computations_per_step_per_rank": per_step_computations or None,
    }


def renice(pid: int, nice: int) -> None:
    """Set the nice value of every thread of `pid` (Linux's nice is per thread; threads started later inherit
    it from the thread that starts them), as systemd's Nice= does for the whole service."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--width", type=int, default=1024, help="steps of about 100 ms with 2 ranks on 2 cores"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--profile-client", action="store_true")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["off", "on"],
        choices=["off", "on", "hooks", "sent"],
        help="besides off and on: hooks (the wrappers, events dropped at once), sent (events sent to a "
        "daemon that runs no job on the GPU)",
    )
    parser.add_argument("--timeout-s", type=float, default=1200)
    parser.add_argument("--daemon-arg", action="append", default=[], help="extra perseusd argument")
    parser.add_argument(
        "--transports",
        nargs="+",
        default=["seqpacket"],
        choices=list(TRANSPORT_ENV),
        help="event transports: seqpacket (carried events on, the default), seqpacket-uncarried "
        "(carry_events = false: every event sent at once), zmq",
    )
    parser.add_argument(
        "--daemon-nice",
        type=int,
        help="the daemon's nice value, every thread (the systemd unit sets Nice=-10; default: as started)",
    )
    args = parser.parse_args()
    results = []
    with daemon_processes() as make:
        for world in args.ranks:
            for transport in args.transports:
                env = TRANSPORT_ENV[transport]
                dirs = DaemonDirs.create()
                daemon = make(dirs, gpus=world, extra_args=tuple(args.daemon_arg), env=env).start()
                if args.daemon_nice is not None:
                    assert daemon.proc is not None
                    renice(daemon.proc.pid, args.daemon_nice)
                with tempfile.TemporaryDirectory(prefix="perseus-overhead-") as work:
                    results.append({"transport": transport} | _run_world(args, world, daemon, Path(work)))
                daemon.stop()
    load = os.getloadavg()
    print(
        json.dumps(
            {
                "load_avg": [round(x, 2) for x in load],
                "cpus": os.cpu_count(),
                "daemon_nice": args.daemon_nice,
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

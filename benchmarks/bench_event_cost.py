"""What one event costs the daemon in CPU: one client process sends a training-like stream of events, paced
(one event per wake-up, as training sends them), to a perseusd on a simulated GPU; the daemon's CPU time per
event, by thread, comes from /proc (utime + stime of each thread), and so does the client's.

Modes: "sent" (the GPU leased, no plan: decoding, order checks, counting) and "plan" (a per-computation clock
plan alternating two clocks, so every end submits a clock to the GPU's owner thread). Each mode runs
`--rounds` times, alternating with the same runs of another checkout when `--against DIR` is given (for
example `git worktree add /tmp/main main`), so the two are compared on the same machine under the same load.
`--transports` runs this checkout's daemon with each event transport: "seqpacket" (protocol 6.10's
SOCK_SEQPACKET socket, the default) and "zmq" (`seqpacket_events = false`: ZeroMQ's event socket, as before
6.10); the other checkout runs as it is.
The daemon's own work per event sets what a training job pays where the daemon shares its cores
(docs/pytorch.md, "Cost"); this benchmark isolates it from training's noise.

Run timing-sensitive: `flock /tmp/perseus-bench.lock python benchmarks/bench_event_cost.py`; the load is
printed beside the numbers. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's helpers; `measure` puts the measured checkout before it

from benchmarks.processes import cpu_s_by_thread_name  # noqa: E402

MICROBATCHES = 8


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds by thread: "main" (the process's first thread), else the thread's OS name, summed."""
    return cpu_s_by_thread_name(pid, {pid: "main"})


def _used(before: dict[str, float], after: dict[str, float], events: int) -> dict[str, float]:
    return {
        name: round((after[name] - before.get(name, 0.0)) / events * 1e6, 1)
        for name in sorted(after)
        if after[name] > before.get(name, 0.0)
    }


def measure(root: Path, mode: str, events: int, gap_s: float, transport: str) -> dict[str, Any]:
    """One run in checkout `root` (the child process of `_run_in`)."""
    sys.path.insert(0, str(root))
    from perseus_client import PerseusClient

    from tests.support.perseusd_proc import DaemonDirs, daemon_processes

    with daemon_processes() as make:
        env = {"PERSEUSD_SEQPACKET_EVENTS": "false"} if transport == "zmq" else {}
        daemon = make(DaemonDirs.create(), gpus=1, env=env).start()
        assert daemon.proc is not None
        with PerseusClient(daemon.dirs.runtime_dir, job="event-cost", strict=True) as client:
            used_transport = getattr(client, "event_transport", "zmq")
            assert client.daemon_info is not None
            info = client.daemon_info.gpus[0]
            client.claim([info.uuid])
            if mode == "plan":
                low, high = info.supported_sm_clocks_mhz[0], info.supported_sm_clocks_mhz[-1]
                client.set_plan(
                    info.uuid,
                    [
                        {"instruction": kind, "microbatch": mb, "chunk": 0, "freq_mhz": high if i else low}
                        for mb in range(MICROBATCHES)
                        for i, kind in enumerate(("forward", "backward"))
                    ],
                )
            time.sleep(0.5)
            daemon_before, client_before = thread_cpu_s(daemon.proc.pid), thread_cpu_s(os.getpid())
            sent = _send(client, info.uuid, events, gap_s)
            time.sleep(0.3)
            daemon_after, client_after = thread_cpu_s(daemon.proc.pid), thread_cpu_s(os.getpid())
            read = client.event_count()
        by_thread = _used(daemon_before, daemon_after, sent)
        return {
            "mode": mode,
            "transport": used_transport,
            "events": sent,
            "read": read.received,
            "dropped": read.dropped,
            "daemon_us_per_event": round(sum(by_thread.values()), 1),
            "daemon_by_thread_us": by_thread,
            "client_io_thread_us": _used(client_before, client_after, sent).get("ZMQbg/IO/0", 0.0),
            "client_main_thread_us": _used(client_before, client_after, sent).get("main", 0.0),
        }


def _send(client: Any, gpu: str, events: int, gap_s: float) -> int:
    """Steps of 1F1B-like events (a begin and an end per computation), one event per `gap_s`."""
    sent = step = 0
    while sent < events:
        client.step_begin(gpu, step)
        time.sleep(gap_s)
        for microbatch in range(MICROBATCHES):
            for kind in ("forward", "backward"):
                client.computation_begin(gpu, 0, kind, microbatch)
                time.sleep(gap_s)
                client.computation_end(gpu, 0, kind, microbatch)
                time.sleep(gap_s)
        client.step_end(gpu, step)
        time.sleep(gap_s)
        sent += 2 + 4 * MICROBATCHES
        step += 1
    return sent


def _run_in(tree: Path, mode: str, args: argparse.Namespace, transport: str = "default") -> dict[str, Any]:
    """One measurement in checkout `tree` (its own packages first on the path), as a child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "client_lib")])}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--root", str(tree)]
    command += ["--events", str(args.events), "--gap-ms", str(args.gap_ms), "--transport", transport]
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "daemon_us_per_event_median": statistics.median(r["daemon_us_per_event"] for r in runs),
        "main_thread_us_per_event_median": statistics.median(
            r["daemon_by_thread_us"].get("main", 0.0) for r in runs
        ),
        "client_io_thread_us_median": statistics.median(r["client_io_thread_us"] for r in runs),
        "client_main_thread_us_median": statistics.median(r["client_main_thread_us"] for r in runs),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=6000)
    parser.add_argument("--gap-ms", type=float, default=1.0, help="pause after each event (one per wake-up)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["sent", "plan"], choices=["sent", "plan"])
    parser.add_argument("--against", type=Path, help="another checkout to compare with, run alternately")
    parser.add_argument(
        "--transports",
        nargs="+",
        default=["seqpacket", "zmq"],
        choices=["seqpacket", "zmq"],
        help="this checkout's event transports to run (each against the other checkout, alternately)",
    )
    parser.add_argument("--transport", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["sent", "plan"], help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root = args.root or ROOT
        print(json.dumps(measure(root, args.child, args.events, args.gap_ms / 1e3, args.transport)))
        return
    trees = {f"this-{t}": (ROOT, t) for t in args.transports}
    trees |= {"against": (args.against.resolve(), "default")} if args.against else {}
    load_before = os.getloadavg()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {m: [] for m in args.modes} for name in trees}
    for _ in range(args.rounds):
        for mode in args.modes:
            for name, (tree, transport) in trees.items():
                runs[name][mode].append(_run_in(tree, mode, args, transport))
    results = {name: {mode: _summary(r) for mode, r in by_mode.items()} for name, by_mode in runs.items()}
    print(
        json.dumps(
            {
                "load_avg_before": [round(x, 2) for x in load_before],
                "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                "cpus": os.cpu_count(),
                "trees": {name: str(tree) for name, (tree, _transport) in trees.items()},
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

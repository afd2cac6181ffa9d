"""Daemon benchmarks on the sim backend; prints JSON.

- ingest: events/s with 16 client processes (one leased sim GPU each) and how many were lost;
- set_clock_rtt: control-plane set-clock round trip p50/p99 (the event -> clock closed loop comes in a later
  issue; until then this round trip is the event-to-clock-applied stand-in);
- restore_after_sigkill: client SIGKILL -> GPU unlocked (read from the sim GPU's shared state) p50/p99;
- rss and idle CPU of a daemon with 8 sim GPUs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient

from benchmarks.processes import process_cpu_s, rss_mb
from tests.support.perseusd_proc import (
    DaemonDirs,
    daemon_processes,
    sim_control,
    start_lease_holder,
    stop_process,
)

CLIENTS = 16
EVENTS_PER_CLIENT = 20_000
RESTORE_ROUNDS = 20


def sender(runtime_dir: str, index: int, go: Any, out: Any) -> None:
    """One sender process: claim GPU `index`, wait for `go`, send `EVENTS_PER_CLIENT` events flat out, put
    (events sent, events dropped) on `out`, then hold the lease while the daemon drains."""
    with PerseusClient(runtime_dir, job=f"bench-{index}", timeout_s=10, strict=True) as client:
        gpu = client.daemon_info.gpus[index].uuid  # type: ignore[union-attr]
        client.claim([gpu])
        go.wait()
        for microbatch in range(EVENTS_PER_CLIENT // 2):
            client.computation_begin(gpu, 0, "forward", microbatch)
            client.computation_end(gpu, 0, "forward", microbatch)
        out.put((client.events_sent, client.events_dropped))
        time.sleep(3)  # keep the lease while the daemon drains


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def bench_ingest(make: Any) -> dict[str, Any]:
    daemon = make(DaemonDirs.create(), gpus=CLIENTS).start()
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=sender, args=(str(daemon.dirs.runtime_dir), i, go, out)) for i in range(CLIENTS)
    ]
    for proc in procs:
        proc.start()
    while daemon.status()["daemon"]["clients"] < CLIENTS:
        time.sleep(0.05)
    go.set()
    samples: list[tuple[float, int]] = []
    while True:
        received = daemon.status()["daemon"]["events_received"]
        samples.append((time.monotonic(), received))
        if len(samples) > 3 and samples[-1][1] == samples[-3][1] and received > 0:
            break
        time.sleep(0.1)
    sent = dropped_client = 0
    for _ in procs:
        s, d = out.get(timeout=30)
        sent, dropped_client = sent + s, dropped_client + d
    for proc in procs:
        proc.join(timeout=10)
    first = next(t for t, n in samples if n > 0)
    last = next(t for t, n in samples if n == samples[-1][1])
    health = daemon.status()["daemon"]
    daemon.stop()
    return {
        "clients": CLIENTS,
        "events_offered": CLIENTS * EVENTS_PER_CLIENT,
        "events_sent": sent,
        "events_dropped_by_clients": dropped_client,
        "events_received": health["events_received"],
        "events_rejected_by_daemon": health["events_dropped"],
        "events_lost_in_transit": sent - health["events_received"],
        "events_per_s": round(health["events_received"] / max(last - first, 1e-3)),
        "target_events_per_s": 100_000,
    }


def bench_set_clock(make: Any) -> dict[str, Any]:
    daemon = make(DaemonDirs.create(), gpus=1).start()
    with PerseusClient(daemon.dirs.runtime_dir, job="bench-rtt", strict=True) as client:
        gpu = client.daemon_info.gpus[0]  # type: ignore[union-attr]
        client.claim([gpu.uuid])
        clocks = gpu.supported_sm_clocks_mhz
        rtt_ms = []
        for i in range(2000):
            began = time.perf_counter()
            client.set_clock(gpu.uuid, clocks[i % 2 * 10])
            rtt_ms.append((time.perf_counter() - began) * 1e3)
    daemon.stop()
    return {
        "what": "control-plane set_clock round trip (stand-in for event->clock applied)",
        "p50_ms": round(statistics.median(rtt_ms), 3),
        "p99_ms": round(_pct(rtt_ms, 0.99), 3),
        "target_p99_ms": 1.0,
    }


def bench_restore(make: Any) -> dict[str, Any]:
    daemon = make(DaemonDirs.create(), gpus=1).start()
    uuid = daemon.status()["gpus"][0]["uuid"]
    delays_ms = []
    for _ in range(RESTORE_ROUNDS):
        holder = start_lease_holder(daemon.dirs.runtime_dir, 1200)
        killed = time.monotonic()
        holder.kill()
        while sim_control(daemon.dirs.runtime_dir, uuid).locked_sm_clock_mhz is not None:
            time.sleep(0.0002)
        delays_ms.append((time.monotonic() - killed) * 1e3)
        stop_process(holder)
    daemon.stop()
    return {
        "rounds": RESTORE_ROUNDS,
        "p50_ms": round(statistics.median(delays_ms), 2),
        "p99_ms": round(_pct(delays_ms, 0.99), 2),
        "target_p99_ms": 50.0,
    }


def bench_footprint(make: Any) -> dict[str, Any]:
    daemon = make(DaemonDirs.create(), gpus=8).start()
    pid = daemon.proc.pid
    time.sleep(1.0)
    idle_rss_mb = rss_mb(pid)
    cpu_s, began = process_cpu_s(pid), time.monotonic()
    time.sleep(5.0)
    cpu_pct = (process_cpu_s(pid) - cpu_s) / (time.monotonic() - began) * 100
    daemon.stop()
    return {
        "gpus": 8,
        "rss_mb": round(idle_rss_mb, 1),
        "target_rss_mb": 80,
        "idle_cpu_pct": round(cpu_pct, 2),
    }


def main() -> None:
    with daemon_processes() as make:
        result = {
            "cpu_count": os.cpu_count(),
            "set_clock_rtt": bench_set_clock(make),
            "restore_after_sigkill": bench_restore(make),
            "footprint": bench_footprint(make),
            "ingest": bench_ingest(make),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

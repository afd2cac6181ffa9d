"""Client-side cost of one begin or end event on the calling thread (target: median <= 5 us).

Starts a sim daemon, claims a GPU, then times batches of `computation_begin`/`computation_end` calls.
Prints JSON.
A baseline (an empty Python method call) measured in the same run is reported for scale.

The headline figure is paced as training is: after each batch the benchmark waits (untimed) until the daemon
has read everything sent, so no event is dropped; a training job sends a few hundred events a second per GPU,
far below what the daemon reads. `flat_out_event_us` sends without pausing: the client's queue (a few
hundred events, kept small on purpose: docs/daemon.md, Limits) fills and most events are dropped and counted,
and a dropped event costs more on the calling thread than a sent one (ZeroMQ raises EAGAIN).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient

from tests.support.perseusd_proc import DaemonDirs, daemon_processes

BATCH = 100
"""Begin/end pairs per timed batch: 200 events, well inside the client's queue."""
BATCHES = 50


def _noop(*_args: object) -> None:
    return None


def timed_batches(
    client: PerseusClient, gpu: str, paced: bool, batches: int = BATCHES, batch_pairs: int = BATCH
) -> list[float]:
    """Per-event time (us) of each of `batches` batches of `batch_pairs` begin/end pairs; `paced`: wait,
    untimed, until the daemon read every event sent."""
    per_event_us: list[float] = []
    for batch in range(batches):
        began = time.perf_counter_ns()
        for microbatch in range(batch_pairs):
            client.computation_begin(gpu, 0, "forward", batch * batch_pairs + microbatch)
            client.computation_end(gpu, 0, "forward", batch * batch_pairs + microbatch)
        per_event_us.append((time.perf_counter_ns() - began) / (2 * batch_pairs) / 1e3)
        deadline_s = time.monotonic() + 5
        while paced and time.monotonic() < deadline_s:
            if client.status().daemon.events_received >= client.events_sent:
                break
            time.sleep(0.001)
    return per_event_us


def main() -> None:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        with PerseusClient(daemon.dirs.runtime_dir, job="bench-client", strict=True) as client:
            gpu = client.daemon_info.gpus[0].uuid  # type: ignore[union-attr]
            client.claim([gpu])
            per_event_us = timed_batches(client, gpu, paced=True)
            dropped_paced = client.events_dropped
            flat_out_us = timed_batches(client, gpu, paced=False)
            baseline_us: list[float] = []
            for _ in range(BATCHES):
                began = time.perf_counter_ns()
                for microbatch in range(BATCH):
                    _noop(gpu, 0, "forward", microbatch)
                    _noop(gpu, 0, "forward", microbatch)
                baseline_us.append((time.perf_counter_ns() - began) / (2 * BATCH) / 1e3)
            time.sleep(0.5)
            health = client.status().daemon
            result = {
                "benchmark": "client_event_cost",
                "median_event_us": round(statistics.median(per_event_us), 3),
                "p90_batch_event_us": round(sorted(per_event_us)[int(0.9 * len(per_event_us))], 3),
                "events_dropped_paced": dropped_paced,
                "flat_out_event_us": round(statistics.median(flat_out_us), 3),
                "events_dropped_flat_out": client.events_dropped - dropped_paced,
                "baseline_empty_call_us": round(statistics.median(baseline_us), 3),
                "target_us": 5.0,
                "events_sent": client.events_sent,
                "events_dropped_client": client.events_dropped,
                "events_received_daemon": health.events_received,
                "events_dropped_daemon": health.events_dropped,
            }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

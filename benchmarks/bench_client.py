"""Client-side cost of one begin or end event on the calling thread (target: median <= 5 us).

Starts a sim daemon, claims a GPU, then times batches of `computation_begin`/`computation_end` calls.
Prints JSON.
A baseline (an empty Python method call) measured in the same run is reported for scale.
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

BATCH = 1000
BATCHES = 50


def _noop(*_args: object) -> None:
    return None


def main() -> None:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        with PerseusClient(daemon.dirs.runtime_dir, job="bench-client") as client:
            gpu = client.daemon_info.gpus[0].uuid  # type: ignore[union-attr]
            client.claim([gpu])
            per_event_us: list[float] = []
            baseline_us: list[float] = []
            for batch in range(BATCHES):
                began = time.perf_counter_ns()
                for microbatch in range(BATCH):
                    client.computation_begin(gpu, 0, "forward", batch * BATCH + microbatch)
                    client.computation_end(gpu, 0, "forward", batch * BATCH + microbatch)
                per_event_us.append((time.perf_counter_ns() - began) / (2 * BATCH) / 1e3)
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

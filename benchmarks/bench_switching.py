"""Per-computation clock switching on the sim backend: event -> clock applied; prints JSON.

One client leases a sim GPU and deploys a plan whose clock changes on every computation, then runs
computations at a fixed pace (begin, ~1 ms of "work", end). On each end the daemon submits the next
computation's clock; the client polls the sim GPU's shared state until it shows that clock.

- daemon: event handled by the daemon -> the owner's set call returned (the daemon's own samples, p50/p99);
- end_to_end: the client's comp_end send -> the sim state showing the new clock (polled by the client);
- changes / skips / late computations as the daemon counted them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus_client import PerseusClient, PlanEntry

from perseusd.workload.sim_workload import SimGpuHandle
from tests.support.perseusd_proc import DaemonDirs, daemon_processes

COMPUTATIONS = 2000
PERIOD_S = 0.002
WORK_S = 0.001
PLAN_LENGTH = 16
POLL_TIMEOUT_S = 0.05


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _spin_until(deadline_s: float) -> None:
    while time.perf_counter() < deadline_s:
        pass


def _run(
    client: PerseusClient, handle: SimGpuHandle, gpu: str, plan: list[PlanEntry]
) -> tuple[list[float], int]:
    e2e_ms: list[float] = []
    missed = 0
    next_s = time.perf_counter()
    for i in range(COMPUTATIONS):
        entry, following = plan[i % len(plan)], plan[(i + 1) % len(plan)]
        _spin_until(next_s)
        client.computation_begin(gpu, 0, entry.instruction, entry.microbatch)
        _spin_until(time.perf_counter() + WORK_S)
        sent_s = time.perf_counter()
        client.computation_end(gpu, 0, entry.instruction, entry.microbatch)
        while handle.current_clock_mhz() != following.freq_mhz:
            if time.perf_counter() - sent_s > POLL_TIMEOUT_S:
                missed += 1
                break
        else:
            e2e_ms.append((time.perf_counter() - sent_s) * 1e3)
        next_s += PERIOD_S
    return e2e_ms, missed


def bench_switching(make: Any) -> dict[str, Any]:
    daemon = make(DaemonDirs.create(), gpus=1).start()
    runtime_dir = daemon.dirs.runtime_dir
    with PerseusClient(runtime_dir, job="bench-switch", timeout_s=10, strict=True) as client:
        info = client.daemon_info.gpus[0]  # type: ignore[union-attr]
        high, low = info.supported_sm_clocks_mhz[0], info.supported_sm_clocks_mhz[-1]
        plan = [PlanEntry("forward", mb, 0, high if mb % 2 == 0 else low) for mb in range(PLAN_LENGTH)]
        client.claim([info.uuid])
        client.set_plan(info.uuid, plan)
        handle = SimGpuHandle.open(runtime_dir / "sim", info.uuid)
        try:
            began_s = time.perf_counter()
            e2e_ms, missed = _run(client, handle, info.uuid, plan)
            elapsed_s = time.perf_counter() - began_s
        finally:
            handle.close()
        stats = daemon.status()["gpus"][0]["plan"]
    daemon.kill()
    return {
        "computations": COMPUTATIONS,
        "period_ms": PERIOD_S * 1e3,
        "achieved_period_ms": round(elapsed_s / COMPUTATIONS * 1e3, 3),
        "daemon_event_to_clock_p50_ms": stats["event_to_clock_p50_ms"],
        "daemon_event_to_clock_p99_ms": stats["event_to_clock_p99_ms"],
        "end_to_end_p50_ms": round(statistics.median(e2e_ms), 3),
        "end_to_end_p99_ms": round(_pct(e2e_ms, 0.99), 3),
        "end_to_end_max_ms": round(max(e2e_ms), 3),
        "end_to_end_missed": missed,
        "clock_changes": stats["clock_changes"],
        "skipped": stats["skipped"],
        "late": stats["late"],
        "errors": stats["errors"],
        "target_p99_ms": 1.0,
    }


def main() -> None:
    with daemon_processes() as make:
        result = {"cpu_count": os.cpu_count(), "switching": bench_switching(make)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""`perseusctl status` against a running daemon, whole command (process start to exit); target < 150 ms.

Starts a sim daemon (4 GPUs), then alternates runs of `perseusctl status` with runs of the bare interpreter
(`python -c pass`, the floor no command goes under) and of an interpreter that only imports pyzmq (what
talking to the daemon through pyzmq would add), so the three are measured under the same load. Prints JSON
with the medians and the load average. Usage: `python benchmarks/bench_ctl_status.py [RUNS]`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.perseusd_proc import DaemonDirs, daemon_processes

RUNS = 20
TARGET_MS = 150.0


def _run_ms(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - began) * 1e3


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    ctl = str(Path(sys.executable).with_name("perseusctl"))
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=4).start()
        status = [ctl, "--runtime-dir", str(daemon.dirs.runtime_dir), "status"]
        commands = {
            "status_ms": status,
            "python_pass_ms": [sys.executable, "-c", "pass"],
            "python_import_zmq_ms": [sys.executable, "-c", "import zmq"],
        }
        _run_ms(status)  # warm the page cache
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():
                times[name].append(_run_ms(command))
    result = {
        "benchmark": "ctl_status",
        "runs": runs,
        **{f"median_{name}": round(statistics.median(values), 1) for name, values in times.items()},
        "min_status_ms": round(min(times["status_ms"]), 1),
        "target_ms": TARGET_MS,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

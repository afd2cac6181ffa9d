"""A workload process for the sim tests: runs computations on a simulated GPU and reports as JSON lines.

Usage: python sim_worker.py SIM_DIR UUID RUNS. Runs RUNS forward computations of stage 0, reports, tries to
write the clock, then waits for a line on stdin and runs one more computation.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from perseusd.workload.sim_workload import SimGpuHandle


def main() -> None:
    sim_dir, uuid, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with SimGpuHandle.open(sim_dir, uuid) as gpu:
        start_s = time.monotonic()
        records = [dataclasses.asdict(gpu.run(0, "forward")) for _ in range(runs)]
        wall_s = time.monotonic() - start_s
        try:
            gpu._state._map[108:112] = b"\x01\x00\x00\x00"
            clock_write = "written"
        except TypeError:
            clock_write = "refused"
        print(json.dumps({"records": records, "wall_s": wall_s, "clock_write": clock_write}), flush=True)
        sys.stdin.readline()
        print(json.dumps(dataclasses.asdict(gpu.run(0, "forward"))), flush=True)


if __name__ == "__main__":
    main()

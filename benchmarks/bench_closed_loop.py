"""The closed loop measured end to end: a real daemon on simulated GPUs and `perseus-emulate`; prints JSON.

For each case a fresh daemon (`--backend sim`, fresh job cache) and one emulated job: the all-max baseline,
then online profiling, solving and the deployed plan, all measured from the simulated GPUs' energy counters in
the same invocation. Cases: GPT-3 175B on the A100 SXM profile with 8 stages and 12, 24 and 48 microbatches,
and on the A40 profile with 12. The published intrinsic saving for A100 8x12 is 15.2 % (no slowdown).

    python benchmarks/bench_closed_loop.py [--cases a100x12,a100x24,a100x48,a40x12] [--time-scale 1.0]
        [--iterations 8] [--pipelines 1] [--timeout-s 3600]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

CASES = {
    "a100x12": ("a100_sxm", 12),
    "a100x24": ("a100_sxm", 24),
    "a100x48": ("a100_sxm", 48),
    "a40x12": ("a40", 12),
}
STAGES = 8


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    model, microbatches = CASES[name]
    gpus = STAGES * args.pipelines
    # Counters update every 100 ms of emulated time: a faster world gets faster counters.
    counters = {"PERSEUSD_SIM_UPDATE_PERIOD_S": str(0.1 * args.time_scale)}
    daemon = DaemonProcess(DaemonDirs.create(), gpus=gpus, extra_args=("--sim-model", model), env=counters)
    daemon.start()
    started_s = time.monotonic()
    try:
        command = [
            sys.executable,
            "-m",
            "perseusd.emulate.main",
            "--profile",
            model,
            "--stages",
            str(STAGES),
            "--microbatches",
            str(microbatches),
            "--pipelines",
            str(args.pipelines),
            "--iterations",
            str(args.iterations),
            "--time-scale",
            str(args.time_scale),
            "--runtime-dir",
            str(daemon.dirs.runtime_dir),
            "--timeout-s",
            str(args.timeout_s),
            "--json",
        ]
        out = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=args.timeout_s + 60
        )
        if out.returncode != 0:
            return {"case": name, "error": out.stderr.strip()[-2000:]}
        result: dict[str, Any] = json.loads(out.stdout)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait()
    return {
        "case": name,
        "model": model,
        "stages": STAGES,
        "microbatches": microbatches,
        "pipelines": args.pipelines,
        "time_scale": args.time_scale,
        "wall_s": round(time.monotonic() - started_s, 1),
        **result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--pipelines", type=int, default=1)
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=3600.0,
        help="per case (profiling A40 or 48 microbatches at time scale 1 takes over 15 min)",
    )
    args = parser.parse_args()
    results = [run_case(name, args) for name in args.cases.split(",")]
    print(json.dumps({"benchmark": "closed_loop", "results": results}, indent=2))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

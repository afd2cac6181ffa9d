"""Online profiling on the simulated H100 board against the real H100's sweep, over seeds; prints JSON.

Each of the GPT pipeline's 4 stages is profiled as the daemon profiles it (`tests/profiling/
test_h100_accuracy.py`: the daemon's sweep settings and budget, a segment per clock, the capped clock), on a
fake clock, with the board's counter noise drawn from each seed. Per case: the profiling iterations of the
slowest stage (the job's, less the daemon's 2 warm-up iterations), the clocks profiled, and the worst time
and energy error of every kept option against `gpt-4stage-sweep.json` (against what the board ran where the
board caps a computation the real GPU did not). The board is driven by the shipped profile, itself from
that sweep: this measures the profiling method, not a real GPU's noise.

    python benchmarks/bench_profiling_h100.py [--seeds 20] [--microbatches 8,16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.profiling.emulation import StageEmulator
from tests.profiling.test_h100_accuracy import ground_truth, profile_stage, truth_at


def run_case(microbatches: int, seed: int) -> dict[str, Any]:
    truth = ground_truth()
    iterations, clocks, worst_time, worst_energy = [], [], 0.0, 0.0
    worst_option: dict[str, Any] = {}
    for index in range(4):
        with tempfile.TemporaryDirectory() as tmp:
            stage = StageEmulator(
                Path(tmp),
                model="h100_sxm",
                num_stages=4,
                num_microbatches=microbatches,
                stage=index,
                seed=seed * 4 + index,
            )
            try:
                profiled = profile_stage(stage)
            finally:
                stage.close()
        iterations.append(profiled.iterations)
        clocks.append(sorted({int(o.clock_mhz) for o in profiled.kept}, reverse=True))
        for option in profiled.kept:
            group = (option.key, option.clock_mhz)
            time_s, energy_j = (
                profiled.ran[group]
                if group in profiled.board_capped
                else truth_at(truth, option.key, option.clock_mhz)
            )
            worst_time = max(worst_time, abs(option.time_s / time_s - 1))
            if abs(option.energy_j / energy_j - 1) > worst_energy:
                worst_energy = abs(option.energy_j / energy_j - 1)
                worst_option = {
                    "stage": option.key[0],
                    "instruction": option.key[1],
                    "clock_mhz": option.clock_mhz,
                    "energy_err": round(option.energy_j / energy_j - 1, 4),
                    "energy_rel_err": round(option.energy_rel_err, 4),  # its standard error
                    "windows": option.windows,
                }
    return {
        "microbatches": microbatches,
        "seed": seed,
        "iterations_per_stage": iterations,
        "kept_clocks_per_stage": clocks,
        "worst_time_err": round(worst_time, 4),
        "worst_energy_err": round(worst_energy, 4),
        "worst_energy_option": worst_option,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--microbatches", default="8,16")
    args = parser.parse_args()
    cases = [run_case(int(m), s) for m in args.microbatches.split(",") for s in range(args.seeds)]
    summary = {
        "max_iterations": max(max(c["iterations_per_stage"]) for c in cases),
        "worst_time_err": max(c["worst_time_err"] for c in cases),
        "worst_energy_err": max(c["worst_energy_err"] for c in cases),
        "cases_within_2pct_time_3pct_energy": sum(
            c["worst_time_err"] <= 0.02 and c["worst_energy_err"] <= 0.03 for c in cases
        ),
        "cases": len(cases),
    }
    report = {"benchmark": "profiling_h100", "summary": summary, "cases": cases}
    print(json.dumps(report, indent=2, default=lambda value: value.item()))  # numpy scalars
    return 0


if __name__ == "__main__":
    sys.exit(main())

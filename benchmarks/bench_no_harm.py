"""Do no harm, measured on the simulated boards: where there is nothing to save, never more than all-max.

For each seed (the boards' counter noise and lock latencies) and each recorded sweep of the real H200
stage (docs/gpu-validate/: 2026-11-25, whose top clocks are power-capped, and 2026-11-26, whose are not):

- a one-stage job (the sweep's stage, 8 microbatches) on one `h100_sxm` board under `no_slowdown`: its
  measured energy per iteration against the all-max baseline of the same run;
- the critical stage of the 4-stage pipeline of `benchmarks/pipeline_check.py` (position 1, a board
  standing in for the real GPU): that stage's own energy against its all-max.

    python benchmarks/bench_no_harm.py [--seeds 0,1,2]

Prints JSON; `harm_pct` > 0 means more energy than all-max.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline_check import (
    REPO,
    CheckSettings,
    _env,
    mixed_daemon,
    recorded_sweep,
    run_position,
    stand_in_reader,
)
from perseusd.emulate.hybrid import pipeline_profile
from perseusd.planner.profile_csv import profile_to_csv

SWEEPS = {
    "h200-2026-11-25": REPO / "docs" / "gpu-validate" / "h200-2026-11-25.json",
    "h200-2026-11-26": REPO / "docs" / "gpu-validate" / "h200-2026-11-26-pipeline-2.json",
}


def one_stage(sweep_path: Path, seed: int) -> dict[str, Any]:
    """The sweep's stage alone, 8 microbatches, on one board standing in for the GPU."""
    sweep = recorded_sweep(sweep_path)
    base = Path(tempfile.mkdtemp(prefix="no-harm-"))
    base.chmod(0o755)
    profile = base / "one-stage.csv"
    profile.write_text(profile_to_csv(pipeline_profile(sweep, 0, (1.0,))))
    with mixed_daemon(base, "sim", min(r.clock_mhz for r in sweep), seed, sim_gpus=1) as runtime_dir:
        command = [sys.executable, "-m", "perseusd.emulate.main", "--profile", str(profile), "--stages", "1"]
        command += ["--microbatches", "8", "--iterations", "12", "--runtime-dir", str(runtime_dir), "--json"]
        done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    report = json.loads(done.stdout)
    return {
        "harm_pct": round(-report["saving_pct"], 2),
        "slowdown_pct": round(report["slowdown_pct"], 2),
        "profiling_iterations": report["profiling"]["daemon_iterations"],
        "plan_note": (report["daemon_jobs"][0] or {}).get("plan_note", ""),
    }


def critical_stage(sweep_path: Path, seed: int) -> dict[str, Any]:
    row = run_position(1, recorded_sweep(sweep_path), CheckSettings(real="sim", seed=seed), stand_in_reader)
    if "error" in row:
        return {"error": row["error"]}
    return {
        "harm_pct": round(-row["real_saving_pct"], 2),
        "slowdown_pct": row["slowdown_pct"],
        "pipeline_saving_pct": row["pipeline_saving_pct"],
        "plan_note": row["plan_note"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    results = []
    for name, path in SWEEPS.items():
        for seed in (int(s) for s in args.seeds.split(",")):
            results.append({"sweep": name, "seed": seed, "case": "one_stage", **one_stage(path, seed)})
            results.append(
                {"sweep": name, "seed": seed, "case": "critical_stage", **critical_stage(path, seed)}
            )
    harmed = [r for r in results if r.get("harm_pct", 0) > 0 or "error" in r]
    print(
        json.dumps(
            {"benchmark": "no_harm", "load_avg": os.getloadavg(), "results": results, "harmed": len(harmed)},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

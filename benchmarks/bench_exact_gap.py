"""How far the Perseus frontier is from the exact discrete optimum (HiGHS MILP) on small cases.

For evenly spaced points of each case's Perseus frontier, `perseusd.planner.exact_gap.frontier_gap`
compares the Perseus plan with the MILP optimum at the same quantised iteration time T, both evaluated with
measured option energies and quantised durations (energy = sum of effective costs + S * T * unit_time *
P_block): `gap_pct` against the optimum over the same Pareto-filtered options the solver picks from,
`gap_all_pct` against the optimum over every profile clock. Prints one JSON object. Needs the `exact` extra
(highspy).

    python benchmarks/bench_exact_gap.py [--sample N] [--time-limit SECONDS] [--points]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perseusd.planner.dag import build_dag  # noqa: E402
from perseusd.planner.exact_gap import frontier_gap  # noqa: E402
from perseusd.planner.profile import Measurement, Profile  # noqa: E402
from perseusd.planner.profile_csv import read_profile  # noqa: E402
from tests.support.synthetic import synthetic_profile  # noqa: E402

A100_PROFILE = ROOT / "perseusd" / "data" / "profiles" / "gpt3-175b+a100_sxm_bf16.csv"
A100_STAGES = (0, 1, 7)
"""Stages of the 8-stage A100 profile kept for the cut-down case (renumbered 0..2; stage 7 differs)."""


def a100_cut_profile() -> Profile:
    """The bundled A100 SXM GPT-3 profile restricted to stages 0, 1 and 7, renumbered 0, 1, 2."""
    full = read_profile(A100_PROFILE)
    renumber = {stage: i for i, stage in enumerate(A100_STAGES)}
    rows = (
        Measurement(renumber[m.stage], m.instruction, m.freq_mhz, m.time_s, m.energy_j)
        for m in full.measurements
        if m.stage in renumber
    )
    return Profile.from_measurements(rows, f"{A100_PROFILE.name}[stages 0,1,7]")


@dataclass(frozen=True)
class Case:
    """One benchmark case: a profile, a 1F1B DAG size and the solver parameters."""

    name: str
    profile: Profile
    stages: int
    microbatches: int
    unit_time_s: float
    p_block_w: float


def cases() -> list[Case]:
    """Synthetic imbalanced profiles (heavier first and last stages, one with plateaus) and the A100 cut."""
    a40_w, a100_w = 70.38, 83.64
    a100 = a100_cut_profile()
    return [
        Case("synthetic-2x2", synthetic_profile(2, 101, imbalance=0.6), 2, 2, 0.001, a40_w),
        Case("synthetic-2x6", synthetic_profile(2, 102, imbalance=0.6), 2, 6, 0.001, a40_w),
        Case("synthetic-3x4", synthetic_profile(3, 103, imbalance=0.6), 3, 4, 0.001, a40_w),
        Case(
            "synthetic-plateau-3x6",
            synthetic_profile(3, 104, imbalance=0.6, plateau=True),
            3,
            6,
            0.001,
            a40_w,
        ),
        Case("synthetic-4x4", synthetic_profile(4, 105, imbalance=0.6), 4, 4, 0.001, a40_w),
        Case("synthetic-4x6", synthetic_profile(4, 106, imbalance=0.6), 4, 6, 0.001, a40_w),
        Case("a100-cut-3x3", a100, 3, 3, 0.001, a100_w),
        Case("a100-cut-3x6", a100, 3, 6, 0.001, a100_w),
    ]


def _stats(values: list[float], digits: int = 4) -> dict[str, float]:
    return {"mean": round(statistics.fmean(values), digits), "max": round(max(values), digits)}


def run_case(case: Case, sample: int, time_limit_s: float, with_points: bool) -> dict[str, Any]:
    """Compare `sample` frontier points of one case with the exact optimum."""
    dag = build_dag("1f1b", case.stages, case.microbatches)
    began = time.perf_counter()
    rows = frontier_gap(
        dag, case.profile, case.unit_time_s, case.p_block_w, sample, time_limit_s=time_limit_s
    )
    wall_s = time.perf_counter() - began
    statuses = {str(r[k]) for r in rows for k in ("exact_status", "exact_all_status")}
    result: dict[str, Any] = {
        "case": case.name,
        "profile": case.profile.source,
        "stages": case.stages,
        "microbatches": case.microbatches,
        "computations": dag.num_computations,
        "unit_time_s": case.unit_time_s,
        "p_block_w": case.p_block_w,
        "points_compared": len(rows),
        "gap_pct": _stats([float(r["gap_pct"]) for r in rows]),
        "gap_all_clocks_pct": _stats([float(r["gap_all_pct"]) for r in rows]),
        "points_with_gap": sum(float(r["gap_pct"]) > 1e-9 for r in rows),
        "milp_s": _stats([float(r["exact_solve_s"]) for r in rows]),
        "milp_all_clocks_s": _stats([float(r["exact_all_solve_s"]) for r in rows]),
        "all_optimal": statuses == {"optimal"},
        "wall_s": round(wall_s, 3),
    }
    if with_points:
        result["points"] = rows
    return result


def main(argv: list[str] | None = None) -> None:
    """Run every case and print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=10, help="frontier points compared per case")
    parser.add_argument("--time-limit", type=float, default=30.0, help="HiGHS time limit per MILP (s)")
    parser.add_argument("--points", action="store_true", help="include every compared point")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    results = [run_case(case, args.sample, args.time_limit, args.points) for case in cases()]
    gap_max = [float(r["gap_pct"]["max"]) for r in results]
    gap_all_max = [float(r["gap_all_clocks_pct"]["max"]) for r in results]
    report = {
        "benchmark": "exact_gap",
        "compared": "Perseus plan vs MILP optimum at the same quantised time; measured effective costs",
        "sample_per_case": args.sample,
        "cases": results,
        "overall": {
            "points_compared": sum(int(r["points_compared"]) for r in results),
            "max_gap_pct": max(gap_max),
            "max_gap_all_clocks_pct": max(gap_all_max),
        },
        "total_s": round(time.perf_counter() - began, 2),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

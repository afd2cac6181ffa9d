"""The closed-loop suite over the workload family (`bench_closed_loop.py --suite family`) and its bars.

Each workload of `benchmarks/workload_family.py` is a case `family:NAME` on the `h100_sxm` board, run once
per seed (`--seeds 0,1,2`); `family:drawn-SEED` is a workload drawn at random (`draw_workload`), judged
the same way. Per run the case's `summary` holds the measured saving, the daemon's prediction,
the switch-aware reference and the switch-free planner's figure (`reference_switch_aware_pct`,
`reference_board_pct`); `family_bars` judges the suite by the family issue's bars:

- every run: measured saving at least 85 % of its workload's switch-aware reference, slowdown at most 1 %,
  at most 80 profiling iterations, at most 10 % of computations begun at a wrong clock (by the simulated
  GPUs' clocks where the run is traced, `--trace-dir`, else by the daemon's count), and the daemon's
  predicted saving within 2 points of the measured one;
- every workload: at most 2 points between its seeds' measured savings;
- over the workloads: the median share of the switch-aware reference at least 93 % (each workload's median
  over its seeds).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.workload_family import FAMILY, profile_csv, workload_named

FAMILY_PREFIX = "family:"
BOARD = "h100_sxm"
RUN_BARS: dict[str, tuple[str, float]] = {
    "of_switch_aware_reference": (">=", 0.85),
    "slowdown_pct": ("<=", 1.0),
    "profiling_iterations": ("<=", 80),
    "wrong_clock_fraction": ("<=", 0.10),
    "prediction_gap_pts": ("<=", 2.0),
}
SEED_SPREAD_PTS = 2.0
MEDIAN_SHARE = 0.93


def family_spec(name: str) -> tuple[str, str, int, int]:
    """`family:NAME` -> (board, profile name, stages, microbatches)."""
    try:
        chosen = workload_named(name.removeprefix(FAMILY_PREFIX))
    except KeyError as exc:
        raise SystemExit(exc.args[0]) from None
    return BOARD, name, chosen.stages, chosen.microbatches


def family_csv(profile_name: str) -> str:
    return profile_csv(workload_named(profile_name.removeprefix(FAMILY_PREFIX)))


def family_case(chosen: Sequence[str] | None = None) -> list[str]:
    """The suite's cases: every workload, or those named in `chosen` (NAME or family:NAME)."""
    names = list(FAMILY) if chosen is None else [n.removeprefix(FAMILY_PREFIX) for n in chosen]
    return [f"{FAMILY_PREFIX}{name}" for name in names]


def _met(value: Any, comparison: str, limit: float) -> bool | None:
    if value is None:
        return None
    return bool(value <= limit if comparison == "<=" else value >= limit)


def family_bars(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per workload: its runs' bars and seed spread; over the suite: the median share and what failed."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_case.setdefault(result["case"], []).append(result)
    workloads: dict[str, Any] = {}
    failed: list[str] = []
    shares: list[float] = []
    for case, runs in by_case.items():
        summaries = [r.get("summary") or {} for r in runs]
        per_run = [
            {bar: _met(s.get(bar), comparison, limit) for bar, (comparison, limit) in RUN_BARS.items()}
            for s in summaries
        ]
        savings = [s["measured_saving_pct"] for s in summaries if s.get("measured_saving_pct") is not None]
        spread = round(max(savings) - min(savings), 2) if len(savings) > 1 else None
        run_shares = [s["of_switch_aware_reference"] for s in summaries if s.get("of_switch_aware_reference")]
        if run_shares:
            shares.append(statistics.median(run_shares))
        workloads[case] = {
            "seeds": [r.get("seed") for r in runs],
            "measured_saving_pct": savings,
            "seed_spread_pts": spread,
            "seed_spread_met": None if spread is None else spread <= SEED_SPREAD_PTS,
            "runs": per_run,
        }
        errors = [r for r in runs if "error" in r]
        if errors or any(v is False for bars in per_run for v in bars.values()) or (spread and spread > 2):
            failed.append(case)
    median_share = round(statistics.median(shares), 3) if shares else None
    return {
        "workloads": workloads,
        "median_of_switch_aware_reference": median_share,
        "median_met": None if median_share is None else median_share >= MEDIAN_SHARE,
        "failed": failed,
    }

"""bench_carbon's measured mode: pooling the interleaved rounds and deciding the bar against the run's noise.

Each arm ran once per round (benchmarks/carbon_measured.py, `measured_arms`). Time is compared on the
median of the per-iteration times (robust against the iterations a load spike on the machine stretches),
pooled over the rounds; carbon on the mean per round. The bar's "no more slowdown than Chase's method" is
decided with a tolerance from the same run: how far all-max and its repeat (`all_max_repeat`, the same
method, run at the other end of each round) differ by the same statistic, the far end of the 95 %
bootstrap interval (iterations resampled within each arm and round) of their pooled-median difference: the
noise floor of a comparison between two arms of this run. The largest per-round difference is reported
beside it (what a single round would have seen), and an interval beside each pooled time ratio.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

BOOTSTRAP_SAMPLES = 2000


def pooled_median_s(rounds: Sequence[dict[str, Any]]) -> float:
    return float(statistics.median(float(t) for r in rounds for t in r["iteration_s"]))


def _bootstrap_ratio_pct(
    mine: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], seed: int = 0
) -> list[float]:
    """The 95 % interval of (pooled median of `mine` / pooled median of `theirs` - 1) x 100."""
    rng = random.Random(seed)

    def resampled(rounds: Sequence[dict[str, Any]]) -> float:
        times = [float(t) for r in rounds for t in rng.choices(r["iteration_s"], k=len(r["iteration_s"]))]
        return statistics.median(times)

    ratios = sorted(100 * (resampled(mine) / resampled(theirs) - 1) for _ in range(BOOTSTRAP_SAMPLES))
    return [round(ratios[int(0.025 * len(ratios))], 2), round(ratios[int(0.975 * len(ratios)) - 1], 2)]


def _per_round_pct(mine: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], key: str) -> list[float]:
    def value(result: dict[str, Any]) -> float:
        if key == "median_iteration_s":
            return float(statistics.median(result["iteration_s"]))
        return float(result[key])

    return [round(100 * (value(a) / value(b) - 1), 2) for a, b in zip(mine, theirs, strict=True)]


def summarise_arm(rounds: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its rounds, against all-max's rounds (`reference`)."""
    count = len(rounds)
    carbon_g = sum(r["carbon_g"] for r in rounds) / count
    reference_g = sum(r["carbon_g"] for r in reference) / len(reference)
    time_s = sum(r["time_s"] for r in rounds) / count
    reference_s = sum(r["time_s"] for r in reference) / len(reference)
    median_s = pooled_median_s(rounds)
    summary: dict[str, Any] = {
        "carbon_g": round(carbon_g, 4),
        "time_s": round(time_s, 2),
        "energy_j": round(sum(r["energy_j"] for r in rounds) / count, 1),
        "median_iteration_s": round(median_s, 4),
        "carbon_saving_pct": round(100 * (1 - carbon_g / reference_g), 2),
        "slowdown_pct": round(100 * (median_s / pooled_median_s(reference) - 1), 2),
        "slowdown_total_time_pct": round(100 * (time_s / reference_s - 1), 2),
        "rounds": [
            {
                **{k: v for k, v in r.items() if k not in ("iteration_s", "iteration_j")},
                "median_iteration_s": round(statistics.median(r["iteration_s"]), 4),
            }
            for r in rounds
        ],
    }
    if "points_seen" in rounds[0]:
        summary["points_seen"] = sorted({p for r in rounds for p in r["points_seen"]})
        summary["point_changes"] = sum(r["point_changes"] for r in rounds)
    return summary


def noise_floor(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """All-max against its repeat in the same run: the tolerance of a time comparison between two arms."""
    first, repeat = results["all_max"], results["all_max_repeat"]
    per_round = _per_round_pct(repeat, first, "median_iteration_s")
    pooled_pct = round(100 * (pooled_median_s(repeat) / pooled_median_s(first) - 1), 2)
    interval_pct = _bootstrap_ratio_pct(repeat, first)
    return {
        "all_max_repeat_vs_all_max_pct": pooled_pct,
        "all_max_repeat_vs_all_max_ci95_pct": interval_pct,
        "all_max_repeat_vs_all_max_per_round_pct": per_round,
        "per_round_max_pct": max(abs(p) for p in per_round),
        "tolerance_pct": max(abs(p) for p in (pooled_pct, *interval_pct)),
    }


def compare(
    mine: Sequence[dict[str, Any]], chase: Sequence[dict[str, Any]], tolerance_pct: float
) -> dict[str, Any]:
    """The carbon policy's arm against Chase's: less carbon, and no more slowdown within the tolerance."""
    carbon_pct = 100 * (sum(r["carbon_g"] for r in mine) / sum(r["carbon_g"] for r in chase) - 1)
    carbon_rounds = _per_round_pct(mine, chase, "carbon_g")
    time_pct = 100 * (pooled_median_s(mine) / pooled_median_s(chase) - 1)
    less_carbon = carbon_pct < 0 and all(p < 0 for p in carbon_rounds)
    no_more_slowdown = time_pct <= tolerance_pct
    return {
        "carbon_vs_chase_pct": round(carbon_pct, 2),
        "carbon_vs_chase_per_round_pct": carbon_rounds,
        "time_vs_chase_pct": round(time_pct, 2),
        "time_vs_chase_ci95_pct": _bootstrap_ratio_pct(mine, chase),
        "time_vs_chase_per_round_pct": _per_round_pct(mine, chase, "median_iteration_s"),
        "tolerance_pct": tolerance_pct,
        "less_carbon": less_carbon,
        "no_more_slowdown": no_more_slowdown,
        "bar_met": less_carbon and no_more_slowdown,
    }

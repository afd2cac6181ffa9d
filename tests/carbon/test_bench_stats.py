"""bench_carbon's measured verdict (benchmarks/carbon_stats.py): rounds pooled, the tolerance from the
run's own all-max repeat, and a spike in one round not deciding the comparison."""

from __future__ import annotations

from typing import Any

from benchmarks import carbon_stats


def _run(times_s: list[float], carbon_g: float) -> dict[str, Any]:
    return {
        "iteration_s": times_s,
        "iteration_j": [1.0] * len(times_s),
        "carbon_g": carbon_g,
        "time_s": sum(times_s),
        "energy_j": float(len(times_s)),
    }


def _rounds(medians_s: list[float], carbon_g: float) -> list[dict[str, Any]]:
    """One run per round, its iterations spread around the round's median."""
    return [_run([m * f for f in (0.99, 1.0, 1.0, 1.01, 1.5)], carbon_g) for m in medians_s]


def test_the_tolerance_is_the_far_end_of_the_all_max_repeat_interval() -> None:
    results = {"all_max": _rounds([1.0, 1.0, 1.0], 10.0), "all_max_repeat": _rounds([1.005, 0.99, 1.0], 10.0)}
    noise = carbon_stats.noise_floor(results)
    assert noise["all_max_repeat_vs_all_max_per_round_pct"] == [0.5, -1.0, 0.0]
    assert noise["per_round_max_pct"] == 1.0
    low, high = noise["all_max_repeat_vs_all_max_ci95_pct"]
    assert low <= noise["all_max_repeat_vs_all_max_pct"] <= high
    assert noise["tolerance_pct"] == max(abs(low), abs(high))
    assert 0 < noise["tolerance_pct"] <= 1.0


def test_a_slowdown_within_the_noise_floor_meets_the_bar_and_one_beyond_it_does_not() -> None:
    chase = _rounds([1.0, 1.0, 1.0], 10.0)
    within = carbon_stats.compare(_rounds([1.005, 1.005, 1.005], 8.0), chase, tolerance_pct=1.0)
    assert (within["less_carbon"], within["no_more_slowdown"], within["bar_met"]) == (True, True, True)
    assert within["time_vs_chase_pct"] == 0.5
    beyond = carbon_stats.compare(_rounds([1.02, 1.02, 1.02], 8.0), chase, tolerance_pct=1.0)
    assert (beyond["no_more_slowdown"], beyond["bar_met"]) == (False, False)


def test_a_spike_in_one_round_does_not_decide_the_pooled_time() -> None:
    """Chase's arm stretched by a load spike in one round: the pooled median barely moves."""
    spiked = _rounds([1.0, 1.0, 1.3], 10.0)
    mine = carbon_stats.compare(_rounds([1.0, 1.0, 1.0], 8.0), spiked, tolerance_pct=0.5)
    assert mine["time_vs_chase_per_round_pct"][2] < -20
    assert abs(mine["time_vs_chase_pct"]) < 1.0


def test_more_carbon_in_any_round_is_not_less_carbon() -> None:
    chase = _rounds([1.0, 1.0], 10.0)
    mixed = [*_rounds([1.0], 5.0), *_rounds([1.0], 10.5)]
    verdict = carbon_stats.compare(mixed, chase, tolerance_pct=1.0)
    assert verdict["carbon_vs_chase_pct"] < 0
    assert (verdict["less_carbon"], verdict["bar_met"]) == (False, False)


def test_an_arm_is_summarised_against_all_max() -> None:
    reference = _rounds([1.0, 1.0], 10.0)
    summary = carbon_stats.summarise_arm(_rounds([1.1, 1.1], 9.0), reference)
    assert summary["carbon_saving_pct"] == 10.0
    assert summary["slowdown_pct"] == 10.0
    assert [r["median_iteration_s"] for r in summary["rounds"]] == [1.1, 1.1]
    assert all("iteration_s" not in r for r in summary["rounds"])

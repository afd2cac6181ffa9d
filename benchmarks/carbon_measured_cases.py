"""bench_carbon's measured mode: the cases (the arms of each job, the segment, Chase's limits per interval and
the allowed slowdown from the model) and the JSON (benchmarks/carbon_measured.py runs the arms)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import carbon_measured, carbon_stats
from benchmarks.carbon_measured import Arm, Workload
from benchmarks.carbon_model import CASES, job_at_all_max, power_limit_choices, replay
from perseusd.carbon.choice import DEFAULT_ETA, ChaseWeights, chase_cost
from perseusd.carbon.forecast import forecast
from perseusd.carbon.traces import SignalPoint
from perseusd.gpu.sim_boards import load_board

DEFAULT_ARMS = "chase,carbon_policy"
"""The arms run beside all-max and its repeat without `--arms`: the bar's, at Chase's eta."""


def widest_start(trace: list[SignalPoint], intervals: int) -> int:
    """The first interval (from the second day: the forecaster has a day to train on) of the segment of
    `intervals` whose intensities span the most."""
    starts = range(48, max(49, len(trace) - intervals - intervals // 4))
    return max(
        starts,
        key=lambda i: (
            max(v.value for v in trace[i : i + intervals]) - min(v.value for v in trace[i : i + intervals])
        ),
    )


def measured_case(
    name: str, trace: list[SignalPoint], predicted: list[float], args: argparse.Namespace
) -> dict[str, Any]:
    """The arms run on the emulated job against the daemon (benchmarks/carbon_measured.py)."""
    board, stages, microbatches, _unit_s = CASES[name]
    dag, base = job_at_all_max(name)
    limits = power_limit_choices(dag, board, args.limit_step_w)
    intervals = args.measured_intervals
    start = args.measured_start if args.measured_start >= 0 else widest_start(trace, intervals)
    actual = [p.value for p in trace]
    time_scale = args.time_scale_a100 if board == "a100_sxm" else 1.0
    work = Workload(
        board,
        stages,
        microbatches,
        time_scale,
        max(actual),
        args.iterations_per_interval * base.time_s * time_scale,
        start,
        intervals * args.iterations_per_interval,
    )
    p_max_w = load_board(board).power_limit_max_w

    def chase_limits(eta: float, series: Sequence[float]) -> tuple[list[float], float]:
        """Chase's limit per interval, and the model's slowdown of Chase's method on the segment."""
        weights = ChaseWeights(eta, max(actual), stages * p_max_w)
        chosen = [
            min(limits, key=lambda c: (chase_cost(c.time_s, c.energy_j, ci, weights), c.time_s))
            for ci in series
        ]
        segment = actual[start:] + actual[:start]
        step_s = args.iterations_per_interval * base.time_s
        model = replay(segment, step_s, work.iterations, lambda i: chosen[(start + i) % len(chosen)])
        slowdown = model["time_s"] / (work.iterations * base.time_s) - 1
        return [float(c.label.removesuffix(" W")) for c in chosen], max(0.0, slowdown)

    limits_w, slowdown = chase_limits(DEFAULT_ETA, predicted)
    switch_w, switch_slowdown = chase_limits(args.switch_eta, predicted)
    perfect_w, _ = chase_limits(args.switch_eta, actual)
    eta = args.switch_eta
    arms = [
        Arm("all_max"),
        Arm("chase", limits_w=limits_w),
        Arm("perseus_fastest", policy="fastest"),
        Arm("carbon_policy", policy="carbon", target=slowdown),
        Arm(f"chase_eta_{eta:g}", eta=eta, limits_w=switch_w),
        Arm(f"carbon_policy_eta_{eta:g}", policy="carbon", target=switch_slowdown, eta=eta),
        Arm(f"chase_perfect_eta_{eta:g}", eta=eta, limits_w=perfect_w, perfect=True),
        Arm(
            f"carbon_policy_perfect_eta_{eta:g}",
            policy="carbon",
            target=switch_slowdown,
            eta=eta,
            perfect=True,
        ),
    ]
    wanted = set((args.arms or DEFAULT_ARMS).split(","))
    arms = [Arm("all_max"), *(a for a in arms[1:] if a.name in wanted), Arm("all_max_repeat")]
    rounds = carbon_measured.measured_arms(
        arms,
        work,
        trace,
        args.forecaster,
        lambda line: print(f"{name} {line}", file=sys.stderr, flush=True),
        max(1, args.rounds),
    )
    if args.raw_json is not None:
        args.raw_json.with_suffix(f".{name}.json").write_text(json.dumps(rounds))
    results = {arm: carbon_stats.summarise_arm(found, rounds["all_max"]) for arm, found in rounds.items()}
    noise = carbon_stats.noise_floor(rounds)
    pairs = (("carbon_policy", "chase"), (f"carbon_policy_eta_{eta:g}", f"chase_eta_{eta:g}"))
    bars = {
        policy: carbon_stats.compare(rounds[policy], rounds[chase], noise["tolerance_pct"])
        for policy, chase in pairs
        if policy in rounds and chase in rounds
    }
    gains = {
        a: round(results[a]["carbon_g"] - results[b]["carbon_g"], 4)
        for a, b in (
            (f"carbon_policy_eta_{eta:g}", f"carbon_policy_perfect_eta_{eta:g}"),
            (f"chase_eta_{eta:g}", f"chase_perfect_eta_{eta:g}"),
        )
        if a in results and b in results
    }
    segment = actual[start : start + intervals]
    errors = [abs(predicted[i] - actual[i]) / actual[i] for i in range(start, start + intervals)]
    return {
        "case": name,
        "board": board,
        "board_power_capping": load_board(board).power_capping,
        "time_scale": time_scale,
        "segment": {"start": start, "intervals": intervals, "min": min(segment), "max": max(segment)},
        "interval_s": round(work.interval_s, 3),
        "iterations": work.iterations,
        "all_max_iteration_model": {"time_s": base.time_s * time_scale, "energy_j": base.energy_j},
        "allowed_slowdown_pct": {
            "carbon_policy": round(100 * slowdown, 2),
            f"eta_{eta:g}": round(100 * switch_slowdown, 2),
        },
        "segment_forecast_mape_pct": round(100 * sum(errors) / len(errors), 3),
        "rounds": max(1, args.rounds),
        "noise_floor": noise,
        "results": results,
        "versus_chase": bars,
        "bar_met": {k: v["bar_met"] for k, v in bars.items()},
        "perfect_forecast_gain_g": gains,
    }


def measured_main(trace: list[SignalPoint], args: argparse.Namespace, mape_pct: float) -> int:
    # What the daemon sees during interval i: the day of points before it (carbon_measured.HISTORY_POINTS).
    window = carbon_measured.HISTORY_POINTS
    predicted = [trace[0].value] + [
        forecast(trace[max(0, i - window) : i], args.forecaster).value for i in range(1, len(trace))
    ]
    out = {
        "benchmark": "carbon",
        "basis": "measured: the real daemon on simulated GPUs and the emulated job, the trace replayed "
        "time-compressed through a loopback Electricity Maps server; energy from the GPUs' counters",
        "trace": {"file": args.trace.name, "intervals": len(trace)},
        "iterations_per_interval": args.iterations_per_interval,
        "eta": DEFAULT_ETA,
        "switch_eta": args.switch_eta,
        "forecaster": args.forecaster,
        "forecast_mape_pct": round(mape_pct, 3),
        "machine_load_1min_at_start": round(os.getloadavg()[0], 2),
        "cases": [measured_case(name, trace, predicted, args) for name in args.cases.split(",")],
    }
    out["machine_load_1min_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))
    return 0 if all(all(c["bar_met"].values()) for c in out["cases"]) else 1

"""Carbon-aware training on the Chase trace: all-max, Chase's power limits, Perseus fastest, carbon policy.

The job is a fixed amount of work: as many iterations as all-max runs in the trace's 167 half-hour
intervals, each interval time-compressed to `--iterations-per-interval` all-max iterations. Every method
starts at the trace's first interval and runs until the work is done (a slower method runs past the trace's
end; the trace then repeats). Each interval the method picks how to run from the forecast of the interval's
carbon intensity (the daemon's forecaster, `--forecaster`, default `auto`); the carbon is the energy times the
interval's actual intensity. Methods:

- `all_max`: every computation at its highest clock, no power limit;
- `chase`: Chase's method: every GPU at its highest clock under one power limit per interval, the limit of a
  sweep (board minimum to maximum in `--limit-step-w` steps) minimising Chase's cost (eta = 0.24, reference
  intensity the trace's highest, reference power the GPUs' maximum power limit), capped by the simulated
  board's power-capping model (`perseusd/workload/sim_costs.py`, which both boards use);
- `perseus_fastest`: the frontier's fastest point all the time;
- `carbon_policy`: the daemon's choice (`perseusd.carbon.choice`): the frontier point of least Chase cost
  among those no slower than all-max x (1 + allowed slowdown); the allowed slowdown is Chase's own measured
  slowdown in this run (`carbon_policy`) and, for context, 0 and 5 % (`carbon_policy_at_*`);
- `*_perfect`: the same with the actual intensity in place of the forecast (the forecast's upper bound).

Two modes. `--mode model` (the default, seconds): each frontier point's and each power limit's iteration
time and energy are evaluated on the job's DAG from the bundled measured profile (the same evaluation the
daemon's solver and the simulated GPUs use, blocking power included), once, and the whole trace is replayed
over them. `--mode measured` (minutes): every method is a real run of the emulated job against a fresh
daemon on simulated GPUs, over a segment of the trace time-compressed through a loopback Electricity Maps
server, the energy from the GPUs' counters (benchmarks/carbon_measured.py), with a heavier-eta case where
the policy follows the grid and perfect-forecast arms; its timings depend on the machine's load.

    python benchmarks/bench_carbon.py [--mode model|measured] [--cases a100x12,h100x8]
        [--iterations-per-interval 4] [--forecaster auto|svr|persistence] [--limit-step-w 10]
        [--measured-intervals 24] [--measured-start -1] [--time-scale-a100 0.25] [--switch-eta 0.75]
        [--arms NAME,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import carbon_measured
from benchmarks.carbon_model import (
    CASES,
    ETA_SWEEP,
    Choice,
    frontier_choices,
    job_at_all_max,
    power_limit_choices,
    replay,
)
from perseusd.carbon.choice import DEFAULT_ETA, ChaseWeights, allowed_points, chase_cost, choose_point
from perseusd.carbon.forecast import backtest, forecast
from perseusd.carbon.traces import SignalPoint, load_trace
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.policy import PointSummary
from tests.support.reference_data import CARBON

TRACE = CARBON / "chase_carbon_hist.csv"


def case(
    name: str, trace: list[SignalPoint], predicted: list[float], args: argparse.Namespace
) -> dict[str, Any]:
    board, stages, _microbatches, unit_s = CASES[name]
    dag, base = job_at_all_max(name)
    points = frontier_choices(dag, board, unit_s)
    limits = power_limit_choices(dag, board, args.limit_step_w)
    found = run_methods(trace, predicted, args, DEFAULT_ETA, (stages, board, base, points, limits))
    result = summarise(name, found[0], found[1], points, limits, base)
    result["eta_sweep"] = {}
    for eta in ETA_SWEEP:
        results, allowed = run_methods(trace, predicted, args, eta, (stages, board, base, points, limits))
        shown = summarise(name, results, allowed, points, limits, base)
        result["eta_sweep"][str(eta)] = {
            "bar_met": shown["bar_met"],
            **{k: shown["results"][k] for k in ("chase", "carbon_policy", "carbon_policy_perfect")},
        }
    return result


Setup = tuple[int, str, Choice, list[Choice], list[Choice]]


def run_methods(
    trace: list[SignalPoint], predicted: list[float], args: argparse.Namespace, eta: float, setup: Setup
) -> tuple[dict[str, dict[str, Any]], float]:
    stages, board, base, points, limits = setup
    p_max_w = load_board(board).power_limit_max_w
    actual = [p.value for p in trace]
    weights = ChaseWeights(eta, max(actual), stages * p_max_w)
    step_s = args.iterations_per_interval * base.time_s
    work = len(trace) * args.iterations_per_interval

    def chase_pick(series: Sequence[float]) -> Callable[[int], Choice]:
        def pick(i: int) -> Choice:
            ci = series[i % len(series)]
            return min(limits, key=lambda c: (chase_cost(c.time_s, c.energy_j, ci, weights), c.time_s))

        return pick

    def policy_pick(series: Sequence[float], slowdown: float) -> Callable[[int], Choice]:
        summaries = [PointSummary(i, c.time_s, c.energy_j) for i, c in enumerate(points)]
        allowed = allowed_points(summaries, base.time_s * (1 + slowdown))

        def pick(i: int) -> Choice:
            return points[choose_point(allowed, series[i % len(series)], weights).index]

        return pick

    fastest = min(points, key=lambda c: (c.time_s, c.energy_j))
    results = {
        "all_max": replay(actual, step_s, work, lambda _: base),
        "perseus_fastest": replay(actual, step_s, work, lambda _: fastest),
        "chase": replay(actual, step_s, work, chase_pick(predicted)),
        "chase_perfect": replay(actual, step_s, work, chase_pick(actual)),
    }
    chase_slowdown = results["chase"]["time_s"] / results["all_max"]["time_s"] - 1
    allowed = max(0.0, chase_slowdown)
    results["carbon_policy"] = replay(actual, step_s, work, policy_pick(predicted, allowed))
    results["carbon_policy_perfect"] = replay(actual, step_s, work, policy_pick(actual, allowed))
    for slowdown in (0.0, 0.05):
        key = f"carbon_policy_at_{round(slowdown * 100)}pct"
        results[key] = replay(actual, step_s, work, policy_pick(predicted, slowdown))
    return results, allowed


def summarise(
    name: str,
    results: dict[str, dict[str, Any]],
    allowed: float,
    points: list[Choice],
    limits: list[Choice],
    base: Choice,
) -> dict[str, Any]:
    reference = results["all_max"]
    gains = {  # how much less a perfect forecast would have emitted (the forecast's upper bound)
        name: round(results[name]["carbon_g"] - results[f"{name}_perfect"]["carbon_g"], 3)
        for name in ("carbon_policy", "chase")
    }
    for result in results.values():
        result["carbon_saving_pct"] = round(100 * (1 - result["carbon_g"] / reference["carbon_g"]), 2)
        result["slowdown_pct"] = round(100 * (result["time_s"] / reference["time_s"] - 1), 2)
        result["carbon_g"] = round(result["carbon_g"], 1)
        result["time_s"] = round(result["time_s"], 1)
        result["energy_j"] = round(result["energy_j"], 0)
    policy, chase = results["carbon_policy"], results["chase"]
    return {
        "case": name,
        "all_max_iteration": {"time_s": base.time_s, "energy_j": base.energy_j},
        "frontier_points": len(points),
        "power_limits": len(limits),
        "carbon_policy_allowed_slowdown_pct": round(100 * allowed, 2),
        "results": results,
        "bar_met": policy["carbon_g"] < chase["carbon_g"]
        and policy["time_s"] <= chase["time_s"] * (1 + 1e-9),
        "perfect_forecast_gain_g": gains,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--iterations-per-interval", type=int, default=4)
    parser.add_argument("--forecaster", default="auto", choices=("auto", "svr", "persistence"))
    parser.add_argument("--limit-step-w", type=float, default=10.0)
    parser.add_argument("--mode", default="model", choices=("model", "measured"))
    parser.add_argument(
        "--arms", default="", help="measured: arms beside all_max and its repeat (chase,carbon_policy)"
    )
    carbon_measured.add_arguments(parser)
    args = parser.parse_args()
    trace = load_trace(args.trace)
    # Forecasts do not depend on the job's choices: each interval's, once, from the points before it (the
    # first interval, with no history, is forecast as itself).
    predicted = [trace[0].value] + [forecast(trace[:i], args.forecaster).value for i in range(1, len(trace))]
    errors = [abs(p - a.value) / a.value for p, a in zip(predicted[1:], trace[1:], strict=True)]
    day = 48
    if args.mode == "measured":
        from benchmarks.carbon_measured_cases import measured_main

        return measured_main(trace, args, 100 * sum(errors) / len(errors))
    out = {
        "benchmark": "carbon",
        "basis": "model: per-point and per-power-limit iteration time and energy evaluated on the job's DAG "
        "from the bundled measured profile, the trace replayed over them (no emulated runs)",
        "trace": {
            "file": args.trace.name,
            "intervals": len(trace),
            "min": min(p.value for p in trace),
            "max": max(p.value for p in trace),
        },
        "iterations_per_interval": args.iterations_per_interval,
        "eta": DEFAULT_ETA,
        "forecaster": args.forecaster,
        "forecast_mape_pct": round(100 * sum(errors) / len(errors), 3),
        "forecast_mape_from_day_2_pct": {
            m: round(backtest(trace, m, day) or 0.0, 3) for m in ("persistence", "svr")
        },
        "cases": [case(name, trace, predicted, args) for name in args.cases.split(",")],
    }
    print(json.dumps(out, indent=2))
    return 0 if all(c["bar_met"] for c in out["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())

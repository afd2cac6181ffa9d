"""Node power caps: a uniform power limit, one clock for all GPUs, and perseusd's frontier-aware cap; JSON.

For each case (one pipeline, one GPU per stage, on a simulated board) and each budget (a fraction of the
node's all-max power: every computation at its top clock under the default power limit, measured in the
same run), three ways to hold the node within the budget, each replayed on the board's cost model
(`perseusd.power.replay`: the per-computation power capping the simulated GPUs run):

- `uniform`: every GPU's power limit set to budget / GPUs (within the board's limit range), all-max clocks:
  what `nvidia-smi -pl` does;
- `one_clock`: one locked clock for every GPU, the highest whose node power stays within the budget over
  every window (ZeusGlobal-like), default power limits;
- `perseusd`: the node cap's allocation (`perseusd.power.allocate`) over the job's frontier (solved here as
  the daemon does), its chosen point's clocks under its power limits (`window` enforcement, the default;
  below the slowest point, limits fitted on the job's DAG); `perseusd_strict` beside it: the same with
  `strict` enforcement (limits summing to the budget: the hard line);
- `hard_line`: the best hard line found by a search (`perseusd.power.hard_line`): per-GPU limits summing to
  at most the budget, split on the job's DAG over 12 frontier points: what any scheme that holds the budget
  with power limits alone can do on this board.

Each result: iteration slowdown and energy per iteration against all-max, the node's mean power, and the
highest node power over any 1 s window from 2 s after the cap was set (the cap is set half-way through an
iteration of all-max; the limits act 13 ms later, the new plan from the next iteration). The checks: at 70 %,
perseusd slows the iteration at most half as much as the uniform limit (and whether the best hard line
does); every window within budget + 1 %; the hard-line schemes' limits sum to at most the budget.

Cases: `h100x8` (the shipped GPT 4-stage profile measured on an H100, `h100_sxm` board, 8 microbatches) and
`a100x12` (GPT-3 175B, 8 stages, 12 microbatches, on the `a100_sxm` board: 100-500 W, capped by the same
model as the H100 board).

Budgets are fractions of all-max's worst window: what the node draws at most over the enforcement window.
Where the windows check fails for `uniform`, the board's model cannot go below its lowest clock's power (a
computation over the limit at every clock runs at the lowest, drawing more than the limit): a real GPU
would throttle further. An A100 8x12 iteration (2.8 s) is longer than a 1 s window, whose densest second
(every stage computing) no frontier point relieves; `--window-s 3` shows the same node with a window as
long as an iteration.

    python benchmarks/bench_power_cap.py [--cases h100x8,a100x12] [--budgets 0.6,0.7,0.8,0.9] [--window-s 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseusd.power.scenario import Scenario, compare_at, scenario_for

CASES = {"h100x8": ("h100_sxm", 4, 8), "a100x12": ("a100_sxm", 8, 12)}
BUDGETS = (0.6, 0.7, 0.8, 0.9)
WINDOW_TOLERANCE = 0.01


def run_case(name: str, budgets: list[float], window_s: float) -> dict[str, Any]:
    board, stages, microbatches = CASES[name]
    started_s = time.perf_counter()
    scenario: Scenario = scenario_for(board, stages, microbatches, window_s=window_s)
    rows = [compare_at(scenario, fraction) for fraction in budgets]
    at_70 = [r for r in rows if abs(r["budget_fraction"] - 0.7) < 1e-9]
    checks: dict[str, Any] = {
        "budgets_over_budget_plus_1pct": {
            scheme: [
                r["budget_fraction"]
                for r in rows
                if r[scheme]["worst_window_w"] > r["budget_w"] * (1 + WINDOW_TOLERANCE)
            ]
            for scheme in ("uniform", "one_clock", "perseusd", "perseusd_strict", "hard_line")
        },
        "hard_line_limits_sum_within_budget": all(
            sum(r[scheme]["limits_w"]) <= r["budget_w"] + 0.5
            for r in rows
            for scheme in ("perseusd_strict", "hard_line")
            if r[scheme].get("limits_w")
        ),
    }
    if at_70:
        row = at_70[0]
        for scheme in ("perseusd", "perseusd_strict", "hard_line"):
            checks[f"at_70pct_{scheme}_slowdown_at_most_half_of_uniform"] = (
                row[scheme]["slowdown"] <= 0.5 * row["uniform"]["slowdown"]
            )
    return {
        "case": name,
        "board": board,
        "stages": stages,
        "microbatches": microbatches,
        "window_s": window_s,
        "frontier_points": len(scenario.points),
        "all_max": dataclasses.asdict(scenario.all_max),
        "budgets": rows,
        "checks": checks,
        "seconds": round(time.perf_counter() - started_s, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS), help="fractions of all-max")
    parser.add_argument("--window-s", type=float, default=1.0, help="enforcement window (default: 1 s)")
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    results = [run_case(name, budgets, args.window_s) for name in args.cases.split(",")]
    print(json.dumps({"benchmark": "power_cap", "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

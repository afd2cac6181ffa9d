"""Online profiling on the simulated H100 board against the real H100's sweep, over seeds; prints JSON.

Each of the GPT pipeline's 4 stages is profiled as the daemon profiles it (`tests/profiling/
test_h100_accuracy.py`: the daemon's sweep settings and budget, a segment per clock, the capped clock), on a
fake clock, with the board's counter noise drawn from each seed. Per case: the profiling iterations of the
slowest stage (the job's, less the daemon's 2 warm-up iterations), the clocks profiled, and the worst time
and energy error of every kept option against `gpt-4stage-sweep.json` (against what the board ran where the
board caps a computation the real GPU did not). The board is driven by the shipped profile, itself from
that sweep: this measures the profiling method, not a real GPU's noise.

With `--plan`, each case's measured profile (the 4 stages' kept options) is also planned as the daemon plans
it (its unit time, the least-energy point no slower than all-max on that profile), and the point's clocks are
evaluated on the board's effective costs (`bench_closed_loop.board_effective_profile`, at every board clock):
the saving the plan would deliver with instant clock switches, against all-max on the same costs, beside the
planner's saving on those costs themselves (`reference_board_pct`). It does not depend on the machine's load,
which the closed loop (`bench_closed_loop.py`) does.

    python benchmarks/bench_profiling_h100.py [--seeds 20] [--microbatches 8,16] [--plan]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_closed_loop import board_effective_profile
from perseusd.ctl.compare_cmd import no_slowdown_point
from perseusd.ctl.planning_inputs import PlanningInputs
from perseusd.ctl.solve_cmd import solve_points
from perseusd.gpu.sim_boards import load_board
from perseusd.jobs.solving import auto_unit_time_s
from perseusd.planner.baselines import all_max, evaluate_point
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import Instruction, build_dag
from perseusd.planner.profile import Measurement, Profile
from perseusd.profiling.estimator import OptionEstimate
from perseusd.profiling.fill import fill_stage
from perseusd.workload.sim_costs import WorkloadCosts
from tests.profiling.emulation import StageEmulator
from tests.profiling.test_h100_accuracy import ground_truth, profile_stage, truth_at

BOARD = "h100_sxm"


def board_costs() -> Profile:
    """The shipped profile as the board runs it, at every board clock from 450 MHz."""
    board = load_board(BOARD)
    costs = WorkloadCosts(bundled_profile(BOARD), board)
    rows = [
        Measurement(stage, Instruction(instruction), clock, *_cost(costs.cost(stage, instruction, clock)))
        for stage, instruction in costs.keys
        for clock in board.clocks_mhz
        if clock >= 450
    ]
    return board_effective_profile(Profile.from_measurements(rows, source=BOARD), BOARD)


def _cost(cost: Any) -> tuple[float, float]:
    return cost.time_s, cost.energy_j


def plan_figures(kept: list[OptionEstimate], microbatches: int, truth: Profile) -> dict[str, float]:
    """Plan the measured profile's no-slowdown point; its saving and slowdown on the board's costs."""
    p_block_w = load_board(BOARD).idle_power_w(load_board(BOARD).max_clock_mhz)
    measured = Profile.from_measurements(
        [Measurement(o.key[0], Instruction(o.key[1]), o.clock_mhz, o.time_s, o.energy_j) for o in kept]
    )
    dag = build_dag("1f1b", 4, microbatches)
    points, _ = solve_points(
        PlanningInputs(measured, dag, auto_unit_time_s(measured), p_block_w), show_progress=False
    )
    candidates = [evaluate_point(dag, measured, p.clocks_mhz, p_block_w) for p in points]
    predicted_max = all_max(dag, measured, p_block_w)
    chosen = candidates.index(no_slowdown_point(candidates, predicted_max.time_s))
    real = evaluate_point(dag, truth, points[chosen].clocks_mhz, p_block_w)
    real_max = all_max(dag, truth, p_block_w)
    reference = no_slowdown_point(
        [
            evaluate_point(dag, truth, p.clocks_mhz, p_block_w)
            for p in solve_points(
                PlanningInputs(truth, dag, auto_unit_time_s(truth), p_block_w), show_progress=False
            )[0]
        ],
        real_max.time_s,
    )
    return {
        "planned_pct": round(100 * (1 - candidates[chosen].energy_j / predicted_max.energy_j), 2),
        "on_board_pct": round(100 * (1 - real.energy_j / real_max.energy_j), 2),
        "on_board_slowdown_pct": round(100 * (real.time_s / real_max.time_s - 1), 2),
        "reference_board_pct": round(100 * (1 - reference.energy_j / real_max.energy_j), 2),
    }


def run_case(
    microbatches: int, seed: int, truth_costs: Profile | None = None, fill: bool = False
) -> dict[str, Any]:
    truth = ground_truth()
    iterations, clocks, worst_time, worst_energy = [], [], 0.0, 0.0
    worst_option: dict[str, Any] = {}
    kept: list[OptionEstimate] = []
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
        stage_kept = profiled.kept
        if fill and profiled.estimate is not None:
            clocks_mhz = load_board(BOARD).clocks_mhz
            stage_kept, _ = fill_stage(profiled.estimate, profiled.sweep_clocks_mhz, clocks_mhz, stage_kept)
        kept.extend(stage_kept)
        clocks.append(sorted({int(o.clock_mhz) for o in profiled.kept}, reverse=True))
        for option in stage_kept:
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
    plan = {} if truth_costs is None else {"plan": plan_figures(kept, microbatches, truth_costs)}
    return {
        **plan,
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
    parser.add_argument("--plan", action="store_true", help="also plan each measured profile (see above)")
    parser.add_argument(
        "--fill",
        action="store_true",
        help="add the options at unvisited clocks as the daemon does (profile_fill_clocks, perseusd.profiling"
        ".fill); their errors count in the worst error",
    )
    args = parser.parse_args()
    truth_costs = board_costs() if args.plan else None
    cases = [
        run_case(int(m), s, truth_costs, args.fill)
        for m in args.microbatches.split(",")
        for s in range(args.seeds)
    ]
    summary = {
        "max_iterations": max(max(c["iterations_per_stage"]) for c in cases),
        "worst_time_err": max(c["worst_time_err"] for c in cases),
        "worst_energy_err": max(c["worst_energy_err"] for c in cases),
        "cases_within_2pct_time_3pct_energy": sum(
            c["worst_time_err"] <= 0.02 and c["worst_energy_err"] <= 0.03 for c in cases
        ),
        "cases": len(cases),
    }
    plans = [c["plan"] for c in cases if "plan" in c]
    if plans:
        shares = [p["on_board_pct"] / p["reference_board_pct"] for p in plans]
        summary["plan_on_board_pct"] = [
            min(p["on_board_pct"] for p in plans),
            max(p["on_board_pct"] for p in plans),
        ]
        summary["plan_share_of_board_reference"] = [round(min(shares), 3), round(max(shares), 3)]
        summary["plan_worst_slowdown_pct"] = max(p["on_board_slowdown_pct"] for p in plans)
    report = {"benchmark": "profiling_h100", "summary": summary, "cases": cases}
    print(json.dumps(report, indent=2, default=lambda value: value.item()))  # numpy scalars
    return 0


if __name__ == "__main__":
    sys.exit(main())

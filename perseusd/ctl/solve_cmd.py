"""`perseusctl solve`: compute the iteration time-energy frontier of a pipeline offline.

Writes `DIR/frontier.csv` (`time,energy`: one row per emitted point, emission order, model energy, floats
written exactly, the format of the published frontiers) and `DIR/frontier.json` (the frontier with every
plan, see `perseusd.planner.plan`). Planner modules are imported when the command runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseusd.ctl.arguments import add_json_option, add_plot_option
from perseusd.ctl.planning_inputs import PlanningInputs, add_planning_arguments, load_inputs
from perseusd.ctl.progress import ProgressBar
from perseusd.errors import PlanningError

if TYPE_CHECKING:
    from perseusd.planner.solver import FrontierPoint

HELP = "compute the time-energy frontier of a pipeline from a profile"
DESCRIPTION = "Compute the iteration time-energy Pareto frontier and a frequency plan for every point."
FRONTIER_CSV = "frontier.csv"
FRONTIER_JSON = "frontier.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_planning_arguments(parser)
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write frontier.csv and frontier.json here (created if missing); none: only look",
    )
    add_plot_option(parser, "also draw the frontier to this image file")
    add_json_option(parser, "print a JSON summary instead of text")


def solve_points(inputs: PlanningInputs, show_progress: bool = True) -> tuple[list[FrontierPoint], float]:
    """Run the frontier solver; returns the points in emission order and the solve time (s)."""
    from perseusd.planner.solver import FrontierSolver, SolverParams

    start_s = time.perf_counter()
    solver = FrontierSolver(inputs.dag, inputs.profile, SolverParams(inputs.unit_time_s, inputs.p_block_w))
    progress = ProgressBar("solving", solver.t_max_quant - solver.t_min_quant)
    progress.enabled = progress.enabled and show_progress
    points: list[FrontierPoint] = []
    for point in solver.points():
        points.append(point)
        progress.update(len(points))
    progress.close(len(points))
    solve_s = time.perf_counter() - start_s
    if not points:
        raise PlanningError(
            f"the frontier is empty: nothing can be sped up by one unit time ({inputs.unit_time_s} s); "
            "try a smaller --unit-time"
        )
    return points, solve_s


def frontier_csv(points: list[FrontierPoint]) -> str:
    """The `time,energy` CSV text of a frontier (model energy, emission order, exact floats)."""
    return "time,energy\n" + "".join(f"{p.time_s!r},{p.model_energy_j!r}\n" for p in points)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_outputs(inputs: PlanningInputs, points: list[FrontierPoint], out_dir: Path) -> None:
    """Write `frontier.csv` and `frontier.json` into `out_dir` (created if missing)."""
    from perseusd.planner.plan import PlanMeta, frontier_document, save_json

    out_dir.mkdir(parents=True, exist_ok=True)
    _write_text(out_dir / FRONTIER_CSV, frontier_csv(points))
    meta = PlanMeta.for_dag(inputs.dag, inputs.profile, inputs.unit_time_s, inputs.p_block_w)
    save_json(frontier_document(inputs.dag, points, meta), out_dir / FRONTIER_JSON, durable=False)


def summary(
    inputs: PlanningInputs, points: list[FrontierPoint], solve_s: float, out_dir: Path | None
) -> dict[str, Any]:
    """The `--json` summary of a solve."""
    from perseusd.planner.baselines import all_max

    fastest = min(points, key=lambda p: p.quant_time)
    baseline = all_max(inputs.dag, inputs.profile, inputs.p_block_w)
    return {
        "points": len(points),
        "t_min_s": min(p.time_s for p in points),
        "t_max_s": max(p.time_s for p in points),
        "solve_s": solve_s,
        "energy_at_t_min_j": fastest.model_energy_j,
        "refined_energy_at_t_min_j": fastest.refined_energy_j,
        "all_max_time_s": baseline.time_s,
        "all_max_energy_j": baseline.energy_j,
        **inputs.to_json(),
        "profile_digest": inputs.profile.digest(),
        "frontier_csv": None if out_dir is None else str(out_dir / FRONTIER_CSV),
        "frontier_json": None if out_dir is None else str(out_dir / FRONTIER_JSON),
    }


def _print_text(info: dict[str, Any]) -> None:
    saving_pct = 100.0 * (1.0 - info["refined_energy_at_t_min_j"] / info["all_max_energy_j"])
    print(
        f"{info['points']} frontier points in {info['solve_s']:.2f} s "
        f"({info['profile']}, {info['schedule']}, S={info['stages']} M={info['microbatches']})"
    )
    print(f"  time       {info['t_min_s']:.4f} .. {info['t_max_s']:.4f} s")
    print(
        f"  at T_min   predicted {info['energy_at_t_min_j']:.1f} J (cost model), "
        f"{info['refined_energy_at_t_min_j']:.1f} J (profile), {saving_pct:.1f} % below all-max"
    )
    print(f"  all-max    {info['all_max_time_s']:.4f} s, {info['all_max_energy_j']:.1f} J (profile)")
    if info["frontier_csv"] is not None:
        print(f"  wrote      {info['frontier_csv']}, {info['frontier_json']}")


def run(args: argparse.Namespace) -> int:
    """Solve, write the outputs, print the summary."""
    # Thousands of points and their clocks, and no reference cycles: the collector's passes over them would be
    # pure cost (a tenth of an 8 x 96 solve).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if collecting:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    inputs = load_inputs(args)
    points, solve_s = solve_points(inputs)
    out_dir = None if args.out is None else Path(args.out)
    if out_dir is not None:
        write_outputs(inputs, points, out_dir)
    info = summary(inputs, points, solve_s, out_dir)
    if args.plot:
        from perseusd.planner.plot import plot_frontier

        plot_frontier(
            [(p.time_s, p.model_energy_j) for p in points],
            args.plot,
            all_max=(info["all_max_time_s"], info["all_max_energy_j"]),
        )
        info["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_text(info)
    return 0

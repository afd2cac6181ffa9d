"""`perseusctl compare`: Perseus against all-max, EnvPipe, ZeusGlobal and ZeusPerStage on one profile.

Every planner's plans are evaluated the same way: the profile's measured times and energies on the same DAG
with the same blocking power (all figures are predicted from the profile). Without a straggler each planner
runs its fastest plan; for Perseus that is the fastest frontier point (the lowest unit-time count),
re-evaluated with the profile's values, so its energy is the refined energy. Perseus has a second row,
`perseus_no_slowdown`: the daemon's default point, the least energy whose time is no longer than all-max's
(on power-capped GPUs such as the H100 the fastest point is faster than all-max and buys that with energy).
With a straggler factor k every pipeline waits until k x the all-max time; planners that can use the slack
(all but EnvPipe) pick their minimum-energy plan that fits (see `perseusd.planner.straggler`).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from perseusd.argtypes import checked, parse_float
from perseusd.ctl.arguments import add_json_option, add_plot_option
from perseusd.ctl.planning_inputs import (
    PlanningInputs,
    add_factors_option,
    add_planning_arguments,
    load_inputs,
)
from perseusd.ctl.solve_cmd import solve_points

if TYPE_CHECKING:
    from perseusd.planner.baselines import CandidatePoint
    from perseusd.planner.straggler import Comparison, PointSet

HELP = "compare Perseus with all-max and the baselines, with and without stragglers"
DESCRIPTION = (
    "Energy saving and slowdown vs all-max of Perseus, EnvPipe, ZeusGlobal and ZeusPerStage, without a "
    "straggler and with straggler factors."
)
PLANNERS = ("perseus", "perseus_no_slowdown", "envpipe", "zeus_global", "zeus_per_stage")


_factor = checked(
    parse_float, lambda v: 1.0 <= v < math.inf, "a straggler factor must be a finite number >= 1 (got {text})"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_planning_arguments(parser)
    add_factors_option(parser, _factor)
    add_plot_option(parser, "draw every planner's points on one chart")
    add_json_option(parser, "print the comparison as JSON")


def planner_point_sets(inputs: PlanningInputs) -> tuple[dict[str, PointSet], CandidatePoint, dict[str, Any]]:
    """Every planner's measured points, the all-max point, and facts about the Perseus solve."""
    from perseusd.planner.baselines import all_max, evaluate_point, zeus_global, zeus_per_stage
    from perseusd.planner.envpipe import envpipe
    from perseusd.planner.straggler import PointSet

    dag, profile, p_block_w = inputs.dag, inputs.profile, inputs.p_block_w
    points, solve_s = solve_points(inputs)
    measured = [evaluate_point(dag, profile, p.clocks_mhz, p_block_w) for p in points]
    fastest = min(range(len(points)), key=lambda i: points[i].quant_time)
    baseline = all_max(dag, profile, p_block_w)
    sets = {
        "perseus": PointSet(tuple(measured), uses_slack=True, no_straggler=measured[fastest]),
        "perseus_no_slowdown": PointSet(
            tuple(measured), uses_slack=True, no_straggler=no_slowdown_point(measured, baseline.time_s)
        ),
        "envpipe": PointSet(tuple(envpipe(dag, profile, p_block_w)), uses_slack=False),
        "zeus_global": PointSet(tuple(zeus_global(dag, profile, p_block_w))),
        "zeus_per_stage": PointSet(tuple(zeus_per_stage(dag, profile, p_block_w))),
    }
    facts = {"perseus_points": len(points), "solve_s": solve_s}
    return sets, baseline, facts


def no_slowdown_point(points: list[CandidatePoint], all_max_time_s: float) -> CandidatePoint:
    """The least-energy point no slower than all-max (the fastest when none is): the daemon's default."""
    fitting = [p for p in points if p.time_s <= all_max_time_s * (1 + 1e-9)]
    if not fitting:
        return min(points, key=lambda p: (p.time_s, p.energy_j))
    return min(fitting, key=lambda p: (p.energy_j, p.time_s))


def comparison_json(
    table: dict[str, dict[str, Comparison]],
    baseline: CandidatePoint,
    inputs: PlanningInputs,
    facts: dict[str, Any],
) -> dict[str, Any]:
    """The `--json` document."""
    return {
        "baseline": {"time_s": baseline.time_s, "energy_j": baseline.energy_j},
        "planners": {name: {key: c.to_json() for key, c in row.items()} for name, row in table.items()},
        **inputs.to_json(),
        **facts,
    }


def format_table(table: dict[str, dict[str, Comparison]], baseline: CandidatePoint, p_block_w: float) -> str:
    """A text table: energy saving vs all-max (slowdown) per planner and straggler case."""
    keys = list(next(iter(table.values())).keys())
    headers = ["planner"] + ["no straggler" if k == "none" else f"straggler {k}" for k in keys]
    rows = [
        [name] + [f"{c.saving_pct:5.1f} % ({c.slowdown_pct:+.2f} %)" for c in row.values()]
        for name, row in table.items()
    ]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        f"Energy saving vs all-max (slowdown); all-max {baseline.time_s:.4f} s, {baseline.energy_j:.1f} J, "
        f"blocking power {p_block_w} W",
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _plot(path: str, sets: dict[str, PointSet], baseline: CandidatePoint) -> None:
    from perseusd.planner.plot import plot_comparison

    series = {name: sorted((p.time_s, p.energy_j) for p in s.points) for name, s in sets.items()}
    plot_comparison(series, path, all_max=(baseline.time_s, baseline.energy_j))


def run(args: argparse.Namespace) -> int:
    """Solve, run the baselines, account for stragglers, print the comparison."""
    from perseusd.planner.straggler import compare_planners

    inputs = load_inputs(args)
    sets, baseline, facts = planner_point_sets(inputs)
    table = compare_planners(sets, baseline, inputs.dag.num_stages, inputs.p_block_w, tuple(args.factors))
    if args.plot:
        _plot(args.plot, sets, baseline)
    if args.json:
        print(json.dumps(comparison_json(table, baseline, inputs, facts), indent=2))
    else:
        print(format_table(table, baseline, inputs.p_block_w))
    return 0

"""`perseusctl stragglers`: the analytic straggler mode at scale (one straggler among many pipelines).

For each pipeline count P the global batch is split into M = batch / P microbatches per pipeline, that
pipeline's frontier is solved once, and the job's energy with one straggler pipeline is computed for each
factor against all-max under the same straggler (see `perseusd.planner.straggler_scale`). Offline: no
daemon, no GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from perseusd.argtypes import factor_float, non_negative_float, positive_float, positive_int
from perseusd.ctl.arguments import add_json_option, add_plot_option
from perseusd.ctl.planning_inputs import PlanningInputs, add_factors_option, blocking_power_w
from perseusd.ctl.solve_cmd import solve_points

if TYPE_CHECKING:
    from perseusd.planner.profile import Profile
    from perseusd.planner.straggler_scale import JobEnergy, PipelineFrontier

HELP = "job energy with one straggler pipeline among 16-128 data-parallel pipelines"
DESCRIPTION = (
    "Energy saving of Perseus vs all-max for a data-parallel job with one straggler pipeline, per pipeline "
    "count and straggler factor (analytic, from each pipeline's frontier)."
)
DEFAULT_PIPELINES = (16, 32, 64, 128)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="a100_sxm", metavar="FILE", help="profile CSV or bundled name")
    parser.add_argument("--stages", type=positive_int, default=8, metavar="S", help="default: %(default)s")
    parser.add_argument(
        "--pipelines",
        type=positive_int,
        nargs="+",
        default=DEFAULT_PIPELINES,
        metavar="P",
        help="data-parallel pipeline counts (default: 16 32 64 128)",
    )
    parser.add_argument(
        "--global-batch",
        type=positive_int,
        default=1536,
        metavar="B",
        help="sequences per iteration; each pipeline runs B/P microbatches (default: %(default)s)",
    )
    parser.add_argument(
        "--tensor-parallel",
        type=positive_int,
        default=8,
        metavar="TP",
        help="GPUs per stage; scales energies, not savings (default: %(default)s)",
    )
    add_factors_option(parser, factor_float)
    parser.add_argument(
        "--unit-time",
        type=positive_float,
        default=0.001,
        metavar="SECONDS",
        help="the solver's time unit (default: %(default)s)",
    )
    parser.add_argument(
        "--p2p-power",
        type=non_negative_float,
        default=None,
        metavar="WATTS",
        help="blocking power per GPU (default: the bundled profile's measured value, else 0)",
    )
    add_plot_option(parser, "draw saving vs straggler factor, one line per count")
    add_json_option(parser, "print the table as JSON")


def solve_frontiers(
    profile: Profile, args: argparse.Namespace, p_block_w: float
) -> tuple[list[tuple[int, PipelineFrontier]], float]:
    """Each pipeline count's measured frontier (one solve per microbatch count) and the solve time (s)."""
    from perseusd.errors import PlanningError
    from perseusd.planner.dag import build_dag
    from perseusd.planner.straggler_scale import measured_frontier, microbatches_for

    if profile.num_stages < args.stages:
        raise PlanningError(f"profile {profile.source} has {profile.num_stages} stages, not {args.stages}")
    start_s = time.perf_counter()
    by_microbatches: dict[int, PipelineFrontier] = {}
    frontiers = []
    for count in args.pipelines:
        micro = microbatches_for(count, args.global_batch)
        if micro not in by_microbatches:
            dag = build_dag("1f1b", args.stages, micro, 1)
            points, _ = solve_points(PlanningInputs(profile, dag, args.unit_time, p_block_w))
            by_microbatches[micro] = measured_frontier(profile, points, args.stages, micro, p_block_w)
        frontiers.append((count, by_microbatches[micro]))
    return frontiers, time.perf_counter() - start_s


def format_table(rows: list[JobEnergy], frontiers: list[tuple[int, PipelineFrontier]], header: str) -> str:
    """Saving vs all-max per pipeline count (rows) and straggler factor (columns).

    `rows` is `scale_table`'s output: for each of `frontiers` in order, one row per factor.
    """
    per_count = len(rows) // len(frontiers)
    factors = [r.factor for r in rows[:per_count]]
    headers = ["pipelines", "GPUs", "M", "no straggler"] + [f"straggler {k:g}" for k in factors]
    lines = []
    for i, (count, frontier) in enumerate(frontiers):
        mine = rows[i * per_count : (i + 1) * per_count]
        cells = [str(count), str(mine[0].num_gpus), str(frontier.num_microbatches)]
        cells += [f"{frontier.intrinsic_saving_pct:.1f} %"] + [f"{r.saving_pct:.1f} %" for r in mine]
        lines.append(cells)
    widths = [max(len(r[i]) for r in [headers, *lines]) for i in range(len(headers))]
    text = [header, "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    text += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
    return "\n".join(text)


def plot_savings(rows: list[JobEnergy], path: str) -> None:
    """Saving vs straggler factor, one line per pipeline count (matplotlib imported only here)."""
    from perseusd.planner.plot import new_axes, save_figure

    figure, axes = new_axes(
        "One straggler pipeline: job energy saving vs all-max", "straggler factor", "energy saving (%)"
    )
    for count in dict.fromkeys(r.num_pipelines for r in rows):
        mine = [r for r in rows if r.num_pipelines == count]
        label = f"{count} pipelines ({mine[0].num_gpus} GPUs)"
        axes.plot([r.factor for r in mine], [r.saving_pct for r in mine], "o-", ms=4, label=label)
    axes.legend()
    save_figure(figure, path)


def run(args: argparse.Namespace) -> int:
    """Solve each pipeline's frontier, account for one straggler at every factor, print the table."""
    from perseusd.planner.bundled import load_profile
    from perseusd.planner.straggler_scale import scale_table

    profile, bundled_p_block_w = load_profile(args.profile)
    p_block_w = blocking_power_w(args, bundled_p_block_w)
    frontiers, solve_s = solve_frontiers(profile, args, p_block_w)
    rows = scale_table(frontiers, tuple(args.factors), args.tensor_parallel)
    if args.plot:
        plot_savings(rows, args.plot)
    if args.json:
        print(json.dumps(scale_json(args, profile.source, p_block_w, solve_s, frontiers, rows), indent=2))
    else:
        print(format_table(rows, frontiers, _header(args, profile.source, p_block_w)))
    return 0


def scale_json(
    args: argparse.Namespace,
    source: str,
    p_block_w: float,
    solve_s: float,
    frontiers: list[tuple[int, PipelineFrontier]],
    rows: list[JobEnergy],
) -> dict[str, Any]:
    """The `--json` document: the inputs, each pipeline count's intrinsic saving, and the rows."""
    return {
        "profile": source,
        "stages": args.stages,
        "tensor_parallel": args.tensor_parallel,
        "global_batch": args.global_batch,
        "unit_time_s": args.unit_time,
        "p_block_w": p_block_w,
        "solve_s": solve_s,
        "intrinsic_saving_pct": {str(p): f.intrinsic_saving_pct for p, f in frontiers},
        "rows": [r.to_json() for r in rows],
    }


def _header(args: argparse.Namespace, source: str, p_block_w: float) -> str:
    return (
        f"Job energy saving vs all-max with one straggler pipeline ({source}, "
        f"{args.stages} stages x TP {args.tensor_parallel}, global batch {args.global_batch}, "
        f"blocking power {p_block_w} W)"
    )

"""`perseusctl cap model`: the analytic mode of power caps at scale (offline: no daemon, no GPU).

A pool of 128-1,024 GPUs running GPT-3 pipelines (8 stages x TP 8, 12 microbatches on the A100 board by
default) under a budget sweep: the time each way loses against all-max, (a) a uniform power limit vs (c)
perseusd's frontier-aware cap, as a table, JSON or a plot (see `perseusd.power.pool_model`).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from perseusd.argtypes import positive_int
from perseusd.ctl.arguments import add_action, add_json_option, add_plot_option

if TYPE_CHECKING:
    from perseusd.ctl.arguments import Subparsers
    from perseusd.power.pool_model import PoolRow
    from perseusd.power.scenario import Scenario

DEFAULT_GPUS = (128, 256, 512, 1024)
DEFAULT_BUDGETS = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
BOARDS = ("a100_sxm", "a40", "h100_sxm")
MODEL_HELP = "offline: time lost under a pool budget, uniform power limit vs perseusd"
MODEL_DESCRIPTION = "Analytic mode: a pool of GPUs running pipelines under a budget sweep (no daemon)."


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"a budget is a fraction of all-max power in (0, 1], not {text}")
    return value


def add_model_parser(actions: Subparsers) -> None:
    """`cap model`."""
    model = add_action(actions, "model", MODEL_HELP, run_model, description=MODEL_DESCRIPTION)
    model.add_argument("--board", choices=BOARDS, default="a100_sxm", help="board and its bundled profile")
    model.add_argument("--stages", type=positive_int, default=8, metavar="S", help="default: %(default)s")
    model.add_argument(
        "--microbatches", type=positive_int, default=12, metavar="M", help="default: %(default)s"
    )
    model.add_argument(
        "--tensor-parallel", type=positive_int, default=8, metavar="TP", help="GPUs per stage (default: 8)"
    )
    model.add_argument(
        "--gpus", type=positive_int, nargs="+", default=DEFAULT_GPUS, metavar="N", help="pool sizes"
    )
    model.add_argument(
        "--budgets",
        type=_fraction,
        nargs="+",
        default=DEFAULT_BUDGETS,
        metavar="F",
        help="fractions of all-max",
    )
    add_plot_option(model, "draw slowdown vs budget, (a) and (c) per pool size")
    add_json_option(model, "print the rows as JSON")


def plot_rows(rows: list[PoolRow], path: str) -> None:
    """Slowdown vs budget: (a) dashed, (c) solid, one colour per pool size (matplotlib imported only here)."""
    from perseusd.planner.plot import new_axes, save_figure

    figure, axes = new_axes(
        "Pool power budget: iteration slowdown vs all-max", "budget (% of all-max power)", "slowdown (%)"
    )
    for gpus in dict.fromkeys(r.gpus for r in rows):
        mine = [r for r in rows if r.gpus == gpus]
        x = [r.budget_fraction * 100 for r in mine]
        (line,) = axes.plot(
            x, [r.perseusd_slowdown * 100 for r in mine], "o-", ms=4, label=f"{gpus} GPUs: perseusd"
        )
        axes.plot(
            x,
            [r.uniform_slowdown * 100 for r in mine],
            "s--",
            ms=4,
            color=line.get_color(),
            label=f"{gpus}: uniform",
        )
    axes.legend(fontsize=7)
    save_figure(figure, path)


def run_model(args: argparse.Namespace) -> int:
    from perseusd.power.pool_model import format_rows, pool_rows
    from perseusd.power.scenario import scenario_for

    started_s = time.perf_counter()
    scenario = scenario_for(args.board, args.stages, args.microbatches)
    rows = pool_rows(scenario, args.gpus, args.budgets, args.tensor_parallel)
    if args.plot:
        plot_rows(rows, args.plot)
    if args.json:
        print(json.dumps(model_json(args, scenario, rows, time.perf_counter() - started_s), indent=2))
    else:
        print(format_rows(rows, _header(args)))
    return 0


def model_json(
    args: argparse.Namespace, scenario: Scenario, rows: list[PoolRow], seconds: float
) -> dict[str, Any]:
    """The `--json` document: the model's inputs, the all-max figures and the rows."""
    return {
        "board": args.board,
        "stages": args.stages,
        "microbatches": args.microbatches,
        "tensor_parallel": args.tensor_parallel,
        "all_max_time_s": scenario.all_max.time_s,
        "all_max_power_per_pipeline_gpu_w": scenario.all_max.mean_power_w / args.stages,
        "seconds": round(seconds, 2),
        "rows": [r.to_json() for r in rows],
    }


def _header(args: argparse.Namespace) -> str:
    return (
        f"Pool budget, time lost vs all-max: (a) uniform power limit vs (c) perseusd ({args.board}, "
        f"{args.stages} stages x TP {args.tensor_parallel}, {args.microbatches} microbatches; "
        '"(limits)": no point fits, power limits hold the pool)'
    )

"""`perseusctl frontier JOB [--json] [--plot PNG]`: a running job's time-energy frontier, as perseusd has it.

The table lists every point (emission order: the solver's, then the switch-aware descent's, marked) with its
predicted time and energy (the energy from the solver's cost model, and re-evaluated with the profile's
values; where the daemon measured the GPUs' clock-switch latency, time and profile energy are what the
GPUs will really run, docs/solver.md), how much slower it is and how much energy it saves than the fastest
point; the point the job runs is marked, and so is each point the daemon will not deploy (over 10 % of its
computations would begin before their clock is applied, docs/solver.md "Deployable points"). Every figure
is predicted.
`--json` prints the daemon's `perseus-frontier` document unchanged; `--plot` draws the frontier and the
deployed point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from perseus_client.protocol import FrontierRequest

from perseusd.ctl.arguments import add_job_argument, add_json_option, add_plot_option
from perseusd.ctl.daemon_link import fetch_document, find_job, load_frontier_text
from perseusd.ctl.terminal import fmt_pct, format_table
from perseusd.errors import PerseusError

if TYPE_CHECKING:
    from perseusd.planner.plan import Frontier, Plan

HELP = "show a job's time-energy frontier and the point it runs"
DESCRIPTION = "Every frontier point of a job: planned time, energy, and the deployed point."
EXIT_OK = 0
DEPLOYED_MARK = "<- deployed"
HEADER = ("INDEX", "TIME S", "MODEL J", "PROFILE J", "SLOWER", "SAVED", "")
"""Predicted figures. SLOWER (time) and SAVED (profile energy) are relative to the fastest point; the last
column marks the deployed point."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_argument(parser)
    add_json_option(parser, "print the perseus-frontier document")
    add_plot_option(parser, "draw time vs energy and the deployed point to a file")


def fastest_point(frontier: Frontier) -> Plan:
    """The point with the shortest predicted iteration (switch-aware where the daemon followed the points)."""
    return min(frontier.points, key=lambda point: (point.predicted_time_s, point.refined_energy_j))


def _row(point: Plan, fastest: Plan, deployed: int | None) -> list[str]:
    from perseusd.planner.descent_limits import within_late_cap

    marks = [DEPLOYED_MARK] if point.index == deployed else []
    if point.followed is not None and point.followed.descended_from is not None:
        marks.append(f"(descent from {point.followed.descended_from})")
    if point.followed is not None and not within_late_cap(point):
        marks.append(f"(not deployable: {point.followed.late_begins} begin before their clock)")
    return [
        str(point.index),
        f"{point.predicted_time_s:.4f}",
        f"{point.model_energy_j:.1f}",
        f"{point.refined_energy_j:.1f}",
        fmt_pct(point.predicted_time_s / fastest.predicted_time_s - 1.0, 2, sign=True),
        fmt_pct(1.0 - point.refined_energy_j / fastest.refined_energy_j, 1),
        " ".join(marks),
    ]


def render_frontier(frontier: Frontier, job: str, deployed: int | None) -> str:
    """A summary line, then one row per point; `deployed` is the index of the point the job runs."""
    meta = frontier.meta
    chunks = f" x{meta.num_chunks} chunks" if meta.num_chunks > 1 else ""
    where = "none deployed" if deployed is None else f"point {deployed} deployed"
    lines = [
        f"job {job}: {len(frontier.points)} frontier points, {where} ({meta.profile_source}, {meta.schedule} "
        f"S={meta.num_stages} M={meta.num_microbatches}{chunks}, unit time {meta.unit_time_s:g} s)"
    ]
    if frontier.points:
        fastest = fastest_point(frontier)
        lines += format_table([HEADER, *(_row(point, fastest, deployed) for point in frontier.points)])
    return "\n".join(lines)


def plot_deployed(frontier: Frontier, deployed: int | None, path: str, job: str) -> None:
    """Draw the frontier (model energy) and, as a marker, the deployed point."""
    from perseusd.planner.plot import plot_comparison

    series = {"frontier": [(p.time_s, p.model_energy_j) for p in frontier.points]}
    chosen = [(p.time_s, p.model_energy_j) for p in frontier.points if p.index == deployed]
    if chosen:
        series[f"deployed (point {deployed})"] = chosen
    try:
        plot_comparison(series, path, title=f"Perseus frontier of job {job}")
    except OSError as exc:
        raise PerseusError(f"cannot write {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    """Fetch the frontier (and, for the marker, the job's deployed index), then print or draw it."""
    runtime_dir = Path(args.runtime_dir)
    text = fetch_document(runtime_dir, FrontierRequest(job=args.job))
    if args.json:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if args.json and not args.plot:
        return EXIT_OK
    frontier = load_frontier_text(text, args.job)
    info = find_job(runtime_dir, args.job)
    deployed = info.plan_index if info is not None else None
    if args.plot:
        plot_deployed(frontier, deployed, args.plot, args.job)
    if not args.json:
        print(render_frontier(frontier, args.job, deployed))
    return EXIT_OK

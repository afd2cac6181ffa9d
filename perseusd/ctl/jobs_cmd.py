"""`perseusctl jobs [--json] [--watch [SEC]]`: the jobs perseusd profiles, plans and runs on this node.

One table row per job (its state and for how long, schedule, policy, profiling progress, frontier size, the
deployed point and how well its clocks are kept), each followed by one line per data-parallel pipeline.
`status` shows the same section under its GPU table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perseus_client.protocol import JobInfo, PipelineInfo, ProfilingInfo

from perseusd.ctl.daemon_link import fetch_jobs
from perseusd.ctl.terminal import PLACEHOLDER, fmt, fmt_duration, fmt_pct, format_table, watch

EXIT_OK = 0
DEFAULT_WATCH_S = 2.0
HEADER = ("JOB", "UID", "STATE", "SCHEDULE", "POLICY", "PROFILING", "POINTS", "DEPLOYED", "CHG/IT", "WRONG")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `jobs` command."""
    parser = subparsers.add_parser(
        "jobs",
        help="show the jobs perseusd runs: state, policy, deployed plan",
        description="The jobs on this node (yours; every job for root and group perseus-admin).",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=DEFAULT_WATCH_S,
        metavar="SEC",
        help=f"refresh every SEC seconds (default {DEFAULT_WATCH_S:g}) until Ctrl-C",
    )
    parser.set_defaults(func=run)


def jobs_json(jobs: Sequence[JobInfo]) -> list[dict[str, Any]]:
    """One object per job with the `JobInfo` fields (None -> null); `--json` prints `{"jobs": [...]}`."""
    return [dataclasses.asdict(job) for job in jobs]


def policy_label(policy: str, target: float) -> str:
    """`fastest`, `slowdown 5 %`, `time 3.2 s` or `min_energy`: the policy with its target in its unit."""
    if policy == "slowdown":
        return f"slowdown {100.0 * target:g} %"
    if policy == "time":
        return f"time {target:g} s"
    return policy


def schedule_label(job: JobInfo) -> str:
    """`1f1b 8x12`: the schedule and stages x microbatches (x chunks when interleaved)."""
    chunks = f"x{job.chunks}" if job.chunks > 1 else ""
    return f"{job.schedule} {job.num_stages}x{job.num_microbatches}{chunks}"


def _profiling(progress: ProfilingInfo | None) -> str:
    if progress is None:
        return PLACEHOLDER
    return (
        f"{progress.iterations} it, {progress.clocks_done}/{progress.clocks_total} clocks, "
        f"{progress.energy_j:.0f} J"
    )


def slowdown_vs_fastest(job: JobInfo) -> float | None:
    """How much slower the deployed point's planned iteration is than the fastest point's (a fraction)."""
    if job.plan_time_s is None or not job.fastest_time_s:
        return None
    return job.plan_time_s / job.fastest_time_s - 1.0


def _deployed(job: JobInfo) -> str:
    if job.plan_index is None:
        return PLACEHOLDER
    time_s = f"{job.plan_time_s:.4f} s" if job.plan_time_s is not None else PLACEHOLDER
    energy_j = f"{job.plan_energy_j:.1f} J" if job.plan_energy_j is not None else PLACEHOLDER
    return f"#{job.plan_index} {time_s} {energy_j} ({fmt_pct(slowdown_vs_fastest(job), 2, sign=True)})"


def _row(job: JobInfo) -> list[str]:
    row = [
        job.job,
        str(job.uid),
        f"{job.state} {fmt_duration(job.state_for_s)}",
        schedule_label(job),
        policy_label(job.policy, job.target),
        _profiling(job.profiling),
        str(job.frontier_points),
        _deployed(job),
        fmt(job.clock_changes_per_iteration, 1),
        fmt_pct(job.wrong_clock_fraction),
    ]
    if job.error:
        row.append(f"ERROR: {job.error}")
    return row


def _pipeline_line(pipeline: PipelineInfo, num_stages: int) -> str:
    mean_s = f"{pipeline.iteration_time_s:.4f} s" if pipeline.iteration_time_s is not None else PLACEHOLDER
    return (
        f"  pipeline {pipeline.pipeline}: {pipeline.stages_registered}/{num_stages} stages, "
        f"{pipeline.iterations} iterations, {mean_s} per iteration"
    )


def render_jobs(jobs: Sequence[JobInfo]) -> str:
    """The jobs table; each job's row is followed by its pipelines, indented."""
    if not jobs:
        return "no jobs"
    table = format_table([HEADER, *(_row(job) for job in jobs)])
    lines = [table[0]]
    for job, row in zip(jobs, table[1:], strict=True):
        lines.append(row)
        lines.extend(_pipeline_line(pipeline, job.num_stages) for pipeline in job.pipelines)
    return "\n".join(lines)


def _render(runtime_dir: Path, as_json: bool) -> str:
    jobs = fetch_jobs(runtime_dir)
    return json.dumps({"jobs": jobs_json(jobs)}, indent=2) if as_json else render_jobs(jobs)


def run(args: argparse.Namespace) -> int:
    """Print the jobs once, or every `--watch` seconds."""
    runtime_dir = Path(args.runtime_dir)
    if args.watch is None:
        print(_render(runtime_dir, args.json))
        return EXIT_OK
    return watch(lambda: _render(runtime_dir, args.json), args.watch, clear=not args.json)

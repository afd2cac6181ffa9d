"""`perseusctl jobs [--json] [--watch [SEC]]`: the jobs perseusd profiles, plans and runs on this node.

One table row per job (its state and for how long, schedule, policy, profiling progress, frontier size, the
deployed point and how well its clocks are kept); under it a line with its straggler, the iteration time the
other pipelines plan for, the energy saved against all-max and the cluster's view (each only when there is
one); for a job whose pipelines span nodes, its nodes (the leader, the solves, each node's stages and state,
the whole job's measured energy) and what this node cannot see; then a table of its data-parallel pipelines
(this node's and, with a cluster, the other nodes'): how fast each runs against its plan, and which one
straggles. `status` shows the job rows and that line, with
one short line per pipeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from perseus_client.carbon_messages import CarbonInfo, amount_unit, is_carbon
from perseus_client.job_info import JobInfo, PipelineInfo, PlanningInfo, ProfilingInfo

from perseusd.ctl import slurm_cmd
from perseusd.ctl.arguments import add_json_option
from perseusd.ctl.daemon_link import fetch_jobs
from perseusd.ctl.terminal import (
    PLACEHOLDER,
    add_watch_option,
    fmt,
    fmt_duration,
    fmt_pct,
    fmt_unit,
    format_table,
    watch,
)
from perseusd.planner.policy import REGISTRY

HELP = "show the jobs perseusd runs: state, policy, deployed plan"
DESCRIPTION = "The jobs on this node (yours; every job for root and group perseus-admin)."
EXIT_OK = 0
DEFAULT_WATCH_S = 2.0
HEADER = (
    "JOB",
    "UID",
    "STATE",
    "SCHEDULE",
    "POLICY",
    "PROFILING",
    "POINTS",
    "DEPLOYED (PREDICTED)",
    "CHG/IT",
    "WRONG",
)
PIPELINE_HEADER = ("PIPELINE", "NODE", "STAGES", "ITERATIONS", "ITER TIME", "COMPUTE", "PLAN", "SLOWNESS", "")
"""ITER TIME: mean recent iteration; COMPUTE: its median busy part (no waiting for the other pipelines);
PLAN: the frontier point it runs and that point's planned time; SLOWNESS: COMPUTE / planned time."""
LOCAL_NODE = "local"
STRAGGLER_MARK = "<- straggler"
INDENT = "  "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_option(parser)
    add_watch_option(parser, DEFAULT_WATCH_S)


def jobs_json(jobs: Sequence[JobInfo]) -> list[dict[str, Any]]:
    """One object per job with the `JobInfo` fields (None -> null); `--json` prints `{"jobs": [...]}`."""
    return [dataclasses.asdict(job) for job in jobs]


def policy_label(policy: str, target: float) -> str:
    """`no_slowdown`, `fastest`, `slowdown 5 %`, `time 3.2 s` or `min_energy`: the policy with its target in
    its unit."""
    spec = REGISTRY.get(policy)
    if spec is None or spec.target is None:
        return policy
    return f"{policy} {spec.target.label(target)}"


def schedule_label(job: JobInfo) -> str:
    """`1f1b 8x12`: the schedule and stages x microbatches (x chunks when interleaved)."""
    chunks = f"x{job.chunks}" if job.chunks > 1 else ""
    return f"{job.schedule} {job.num_stages}x{job.num_microbatches}{chunks}"


def _profiling(progress: ProfilingInfo | None) -> str:
    if progress is None:
        return PLACEHOLDER
    return (
        f"{progress.iterations} it, {progress.clocks_done}/{progress.clocks_total} clocks, "
        f"{progress.energy_j:.0f} J measured"
    )


def slowdown_vs_fastest(job: JobInfo) -> float | None:
    """How much slower the deployed point's planned iteration is than the fastest point's (a fraction)."""
    if job.plan_time_s is None or not job.fastest_time_s:
        return None
    return job.plan_time_s / job.fastest_time_s - 1.0


def _deployed(job: JobInfo) -> str:
    if job.plan_index is None:
        return PLACEHOLDER
    time_s = fmt_unit(job.plan_time_s, 4, "s")
    energy_j = fmt_unit(job.plan_energy_j, 1, "J")
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
        waiting = job.state == "registered" and job.error.startswith("waiting for ")
        row.append(f"{'WAITING' if waiting else 'ERROR'}: {job.error}")
    return row


def summary_line(job: JobInfo) -> str | None:
    """`  straggler: pipeline 1 x1.20 (announced, since step 40), target 0.1440 s per iteration, measured
    20.1 J per iteration vs 24.0 J at all-max, saved 12.3 kJ vs all-max (measured), cluster fresh, planned in
    0.62 s (fit 0.01, frontier 0.02, follow 0.07, descent 0.42, transfer 0.10)`: what the job's other lines
    do not say, each part only when known."""
    parts = []
    if job.straggler is not None:
        straggler = job.straggler
        parts.append(
            f"straggler: pipeline {straggler.pipeline} x{straggler.factor:.2f} "
            f"({straggler.source}, since step {straggler.since_step})"
        )
    if job.target_time_s is not None:
        parts.append(f"target {job.target_time_s:.4f} s per iteration")
    if job.measured_energy_j is not None:
        all_max = job.measured_all_max_energy_j
        versus = f" vs {all_max:.1f} J at all-max" if all_max is not None else ""
        parts.append(f"measured {job.measured_energy_j:.1f} J per iteration{versus}")
    if job.energy_saved_j:
        source = f" ({job.energy_saved_source})" if job.energy_saved_source else ""
        parts.append(f"saved {fmt_unit(job.energy_saved_j / 1000.0, 1, 'kJ')} vs all-max{source}")
    if job.carbon is not None:
        parts.append(carbon_part(job.carbon))
    if job.cluster:
        parts.append(f"cluster {job.cluster}")
    notes = job.plan_note.split("; ") if job.plan_note else []
    harm = [note for note in notes if not note.startswith("measured ")]  # the rest: a departing plan
    if harm:
        parts.append(f"do no harm: {'; '.join(harm)}")
    parts += [note for note in notes if note.startswith("measured ")]
    accuracy = accuracy_part(job)
    if accuracy:
        parts.append(accuracy)
    if job.planning is not None:
        parts.append(planning_part(job.planning))
    if job.stage_gpus > 1:
        parts.append(f"{job.stage_gpus} GPUs per stage")
    return INDENT + ", ".join(parts) if parts else None


def accuracy_part(job: JobInfo) -> str:
    """`saving predicted 15.8 % (profile error 0.9 %), measured 15.1 %: 0.7 points short (error 2.1),
    re-planned`: the job's own error, each part only when known ("" when none is)."""
    parts = []
    if job.predicted_saving_pct is not None:
        error = f" (profile error {job.profile_error_pct:.1f} %)" if job.profile_error_pct is not None else ""
        parts.append(f"saving predicted {job.predicted_saving_pct:.1f} %{error}")
    if job.measured_saving_pct is not None and job.predicted_saving_pct is not None:
        gap = job.predicted_saving_pct - job.measured_saving_pct
        within = f" (error {job.saving_error_pts:.1f})" if job.saving_error_pts is not None else ""
        word = "short" if gap >= 0 else "over"
        parts.append(f"measured {job.measured_saving_pct:.1f} %: {abs(gap):.1f} points {word}{within}")
    if job.accuracy_action:
        parts.append(job.accuracy_action)
    return ", ".join(parts)


def planning_part(planning: PlanningInfo) -> str:
    """`planned in 0.62 s (fit 0.01, frontier 0.02, follow 0.07, descent 0.42, transfer 0.10)`: from profiling
    done to the plan deployed."""
    p = planning
    phases = zip(
        ("fit", "frontier", "follow", "descent", "transfer"),
        (p.fit_s, p.frontier_s, p.follow_s, p.descent_s, p.transfer_s),
        strict=True,
    )
    return f"planned in {p.total_s:.2f} s ({', '.join(f'{name} {value:.2f}' for name, value in phases)})"


def span_lines(job: JobInfo) -> list[str]:
    """A job whose pipelines span nodes: `  spans 2 nodes: leader node-b, 1 solve, plan epoch 3; whole job
    measured 6210.0 J per iteration vs 7330.0 J at all-max (-15.3 %)`, one line per node, and what this node
    cannot see."""
    span = job.span
    if span is None:
        return []
    leader = span.leader or PLACEHOLDER
    head = (
        f"{INDENT}spans {len(span.members)} nodes (this one {span.node}): leader {leader}, "
        f"{span.solves} solve(s), plan epoch {span.plan_epoch}, cluster view {span.view}"
    )
    if span.measured_energy_j is not None and span.measured_all_max_energy_j:
        change = span.measured_energy_j / span.measured_all_max_energy_j - 1.0
        head += (
            f"; whole job measured {span.measured_energy_j:.1f} J per iteration vs "
            f"{span.measured_all_max_energy_j:.1f} J at all-max ({fmt_pct(change, 1, sign=True)})"
        )
    lines = [head]
    for member in span.members:
        energy = "" if member.measured_energy_j is None else f", {member.measured_energy_j:.1f} J/iteration"
        lines.append(
            f"{INDENT}{INDENT}{member.node}: {member.stages}, {member.state}, "
            f"{member.profiling_iterations} profiling iterations{energy}"
        )
    if span.missing:
        lines.append(f"{INDENT}{INDENT}cannot see: {span.missing}")
    return lines


def carbon_part(carbon: CarbonInfo) -> str:
    """`carbon 12.3 g (measured) vs 14.1 g at all-max (predicted), forecast 612.3 gCO2eq/kWh`; with a price
    signal `cost 0.0123 EUR (measured) vs 0.0141 EUR at all-max (measured), ...`: each figure says its basis
    (the job's own is always the counters'), never one label for a measured figure and a predicted one."""
    if is_carbon(carbon.unit):
        name, unit = "carbon", "g"
    else:
        name, unit = "cost", amount_unit(carbon.unit)
    text = f"{name} {carbon.carbon_g:.3g} {unit} (measured)"
    if carbon.all_max_carbon_g is not None:
        text += f" vs {carbon.all_max_carbon_g:.3g} {unit} at all-max ({carbon.all_max_basis or 'predicted'})"
    if carbon.uncounted_energy_j:
        text += f", {fmt_unit(carbon.uncounted_energy_j / 1000.0, 1, 'kJ')} without a signal"
    if carbon.basis:
        text += f", point by {carbon.basis}"
    return text


def _is_straggler(job: JobInfo, pipeline: PipelineInfo) -> bool:
    return job.straggler is not None and job.straggler.pipeline == pipeline.pipeline


def _pipeline_row(job: JobInfo, pipeline: PipelineInfo) -> list[str]:
    plan = PLACEHOLDER
    if pipeline.plan_index is not None:
        plan = f"#{pipeline.plan_index} {fmt_unit(pipeline.plan_time_s, 4, 's')}"
    return [
        str(pipeline.pipeline),
        pipeline.node or LOCAL_NODE,
        f"{pipeline.stages_registered}/{job.num_stages}",
        str(pipeline.iterations),
        fmt_unit(pipeline.iteration_time_s, 4, "s"),
        fmt_unit(pipeline.compute_time_s, 4, "s"),
        plan,
        PLACEHOLDER if pipeline.slowness is None else f"x{pipeline.slowness:.2f}",
        STRAGGLER_MARK if _is_straggler(job, pipeline) else "",
    ]


def pipeline_table(job: JobInfo) -> list[str]:
    """The job's pipelines as an indented table (nothing when none has registered yet)."""
    if not job.pipelines:
        return []
    rows = format_table([PIPELINE_HEADER, *(_pipeline_row(job, pipeline) for pipeline in job.pipelines)])
    return [INDENT + row for row in rows]


def pipeline_lines(job: JobInfo) -> list[str]:
    """One short line per pipeline, `  pipeline 0: 8/8 stages, 120 iterations, 2.8300 s per iteration`."""
    return [
        f"{INDENT}pipeline {pipeline.pipeline}: {pipeline.stages_registered}/{job.num_stages} stages, "
        f"{pipeline.iterations} iterations, {fmt_unit(pipeline.iteration_time_s, 4, 's')} per iteration"
        f"{f' (node {pipeline.node})' if pipeline.node else ''}"
        for pipeline in job.pipelines
    ]


def _render_with(jobs: Sequence[JobInfo], pipelines: Callable[[JobInfo], list[str]]) -> str:
    if not jobs:
        return "no jobs"
    table = format_table([HEADER, *(_row(job) for job in jobs)])
    lines = [table[0]]
    for job, row in zip(jobs, table[1:], strict=True):
        summary = summary_line(job)
        lines += [row, *([summary] if summary else []), *span_lines(job), *pipelines(job)]
    return "\n".join(lines)


def render_jobs(jobs: Sequence[JobInfo]) -> str:
    """The jobs table; each job's row is followed by its summary line and its pipeline table, indented."""
    return _render_with(jobs, pipeline_table)


def render_jobs_brief(jobs: Sequence[JobInfo]) -> str:
    """The jobs section of `status`: the same rows and summary lines, one short line per pipeline."""
    return _render_with(jobs, pipeline_lines)


def _render(runtime_dir: Path, as_json: bool) -> str:
    jobs = fetch_jobs(runtime_dir)
    slurm = slurm_cmd.fetch_slurm_jobs(runtime_dir, quiet=True)  # the Slurm jobs' GPU energy (docs/slurm.md)
    if as_json:
        return json.dumps({"jobs": jobs_json(jobs), "slurm_jobs": slurm_cmd.slurm_jobs_json(slurm)}, indent=2)
    return render_jobs(jobs) + ("\n\n" + slurm_cmd.render(slurm) if slurm else "")


def run(args: argparse.Namespace) -> int:
    """Print the jobs once, or every `--watch` seconds."""
    runtime_dir = Path(args.runtime_dir)
    if args.watch is None:
        print(_render(runtime_dir, args.json))
        return EXIT_OK
    return watch(lambda: _render(runtime_dir, args.json), args.watch, clear=not args.json)

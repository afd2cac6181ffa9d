"""`perseusctl plan JOB [--json] [--policy P [--target X]]`: the clock plan a job runs, per stage.

Each stage's computations are listed in schedule order with their clocks, `F0@1410 B0@1260 ...`
(F/B: forward/backward, then the microbatch, `c1` for chunk 1 of an interleaved schedule, `@` the SM clock
in MHz), wrapped to the terminal. `--policy` first chooses which frontier point the job runs (`set_policy`):
`fastest`, `slowdown --target 5%` (or 0.05), `time --target 3.2` (seconds per iteration), `min_energy`,
`carbon [--target 5%]` (follow the grid signal within that slowdown, docs/carbon.md).
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from perseus_client.protocol import Instruction, JobInfo, PlanRequest, Policy, SetPolicy, SetPolicyOk

from perseusd.ctl.arguments import add_job_argument, add_json_option
from perseusd.ctl.daemon_link import ask, fetch_document, find_job, load_plan_text
from perseusd.ctl.jobs_cmd import policy_label, slowdown_vs_fastest
from perseusd.ctl.terminal import fmt_pct
from perseusd.errors import PerseusError
from perseusd.planner.policy import REGISTRY

if TYPE_CHECKING:
    from perseusd.planner.dag import ScheduleStep
    from perseusd.planner.plan import Plan

HELP = "show the clock plan a job runs; optionally set its policy first"
DESCRIPTION = "The deployed plan of a job: per stage, every computation in order with its clock."
EXIT_OK = 0
EXIT_USAGE = 2
POLICIES: tuple[str, ...] = get_args(Policy)
INDENT = "  "


class UsageError(PerseusError):
    """The command line is inconsistent (a policy without its target, or a target it cannot use)."""

    exit_code = EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_argument(parser)
    add_json_option(parser, "print the perseus-plan document")
    parser.add_argument("--policy", choices=POLICIES, help="first choose the frontier point the job runs")
    parser.add_argument(
        "--target",
        metavar="X",
        help="slowdown: a fraction or a percentage (5%%); time: seconds per iteration",
    )


def parse_target(policy: str, text: str | None) -> float:
    """The wire target of a policy: the slowdown as a fraction (`5%` -> 0.05), or seconds; 0 when unused."""
    spec = REGISTRY[policy]
    target = spec.target
    if target is None:
        if text is not None:
            raise UsageError(f"--target is not used by policy {policy}")
        return 0.0
    if text is None and not spec.target_required:
        return 0.0  # carbon: no slowdown allowed beyond all-max's time
    if text is None:
        raise UsageError(f"policy {policy} needs --target ({target.what})")
    raw = text.strip()
    scale = 1.0
    if target.percent and raw.endswith("%"):
        raw, scale = raw[:-1], 0.01
    elif not target.percent and raw.endswith("s"):
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise UsageError(f"--target '{text}' is not {target.what}") from None
    if not math.isfinite(value) or value < 0.0 or (target.positive and value == 0.0):
        raise UsageError(f"--target '{text}' is out of range: expected {target.what}")
    return value


def step_label(step: ScheduleStep, chunked: bool) -> str:
    """`F3`, or `F3c1` in a schedule with several chunks per stage."""
    instruction, microbatch, chunk = step
    letter = Instruction(instruction).letter
    return f"{letter}{microbatch}c{chunk}" if chunked else f"{letter}{microbatch}"


def _stage_lines(plan: Plan, stage: int, width: int) -> list[str]:
    clocks = plan.clocks_mhz[stage]
    chunked = plan.meta.num_chunks > 1
    entries = [
        f"{step_label(step, chunked)}@{clock}" for step, clock in zip(plan.order[stage], clocks, strict=True)
    ]
    changes = sum(1 for prev, cur in itertools.pairwise((*clocks, clocks[0])) if prev != cur)  # wraps around
    title = (
        f"stage {stage}: {len(clocks)} computations, {min(clocks)}..{max(clocks)} MHz, "
        f"{changes} clock changes per iteration"
    )
    body = textwrap.wrap(" ".join(entries), width, initial_indent=INDENT, subsequent_indent=INDENT)
    return [title, *body]


def _headline(job: str, info: JobInfo | None) -> str:
    if info is None or info.plan_index is None:
        return f"job {job}"
    return (
        f"job {job}: point {info.plan_index} of {info.frontier_points}, "
        f"policy {policy_label(info.policy, info.target)}"
    )


def render_plan(plan: Plan, job: str, info: JobInfo | None, width: int = 100) -> str:
    """The plan's summary (planned time and energies, where it comes from), then every stage's clocks."""
    meta = plan.meta
    slower = f" ({fmt_pct(slowdown_vs_fastest(info), 2, sign=True)} vs fastest)" if info is not None else ""
    lines = [
        _headline(job, info),
        f"planned   {plan.predicted_time_s:.4f} s per iteration{slower}, "
        f"predicted {plan.model_energy_j:.1f} J (cost model), {plan.refined_energy_j:.1f} J (profile)",
        f"from      {meta.profile_source}, {meta.schedule} S={meta.num_stages} M={meta.num_microbatches}"
        f"{f' chunks={meta.num_chunks}' if meta.num_chunks > 1 else ''}, unit time {meta.unit_time_s:g} s, "
        f"blocking power {meta.p_block_w:g} W",
    ]
    for stage in range(len(plan.clocks_mhz)):
        lines += _stage_lines(plan, stage, width)
    return "\n".join(lines)


def set_policy(runtime_dir: Path, job: str, policy: str, target: float) -> SetPolicyOk:
    """Ask the daemon to run another frontier point of `job` (the owner or an admin may)."""
    request = SetPolicy(job=job, policy=policy, target=target)  # type: ignore[arg-type]  # checked by argparse
    return ask(runtime_dir, request, SetPolicyOk, admin=False)


def run(args: argparse.Namespace) -> int:
    """Set the policy when asked, then print the plan the job runs."""
    runtime_dir = Path(args.runtime_dir)
    if args.policy is None and args.target is not None:
        raise UsageError("--target needs --policy")
    if args.policy is not None:
        reply = set_policy(runtime_dir, args.job, args.policy, parse_target(args.policy, args.target))
        print(f"job {reply.job}: policy {policy_label(reply.policy, reply.target)}", file=sys.stderr)
    text = fetch_document(runtime_dir, PlanRequest(job=args.job))
    if args.json:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return EXIT_OK
    plan = load_plan_text(text, args.job)
    width = max(shutil.get_terminal_size().columns - 1, 40)
    print(render_plan(plan, args.job, find_job(runtime_dir, args.job), width))
    return EXIT_OK

"""`perseusctl cap`: the node power cap (admin socket: root or group perseus-admin).

    perseusctl cap set --node WATTS        hold this node's GPUs within WATTS
    perseusctl cap clear                   drop the node budget (power limits go back)
    perseusctl cap status [--json] [--watch [SEC]]
    perseusctl cap priority JOB low|normal|high|0|1|2
    perseusctl cap model [--gpus N ...] [--budgets F ...] [--json] [--plot PNG]   (offline, no daemon)

Status: the budget and grant, node power measured from the energy counters over the enforcement window,
the floor (every GPU at its minimum power limit) and the demand (every job at its fastest point, other GPUs
at their maximum limit), each GPU's limit, and each job's point and the slowdown the cap causes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from perseus_client.cap_messages import (
    AdminCapStatus,
    AdminClearCap,
    AdminSetCap,
    AdminSetJobPriority,
    CapStatusReply,
    JobPriorityOk,
)

from perseusd.argtypes import positive_float
from perseusd.ctl.arguments import add_action, add_json_option
from perseusd.ctl.cap_model import add_model_parser
from perseusd.ctl.daemon_link import ask
from perseusd.ctl.terminal import PLACEHOLDER, add_watch_option, fmt, fmt_pct, format_table, watch

HELP = "admin: cap this node's GPU power (set, clear, status, job priority)"
DESCRIPTION = "Hold the node's GPU power within a budget at the least slowdown (docs/power-caps.md)."
EXIT_OK = 0
EXIT_FAILED = 1
DEFAULT_WATCH_S = 1.0
PRIORITY_NAMES = {"low": 0, "normal": 1, "high": 2}
TIER_NAMES = {v: k for k, v in PRIORITY_NAMES.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    set_ = add_action(actions, "set", "set the node budget (W)", run_set)
    set_.add_argument("--node", type=positive_float, required=True, metavar="WATTS", help="node budget (W)")
    add_action(actions, "clear", "drop the node budget; power limits go back", run_clear)
    status = add_action(actions, "status", "budget, grant, measured power, floor, demand, jobs", run_status)
    add_json_option(status)
    add_watch_option(status, DEFAULT_WATCH_S)
    priority = add_action(actions, "priority", "a job's tier: low jobs are slowed first", run_priority)
    priority.add_argument("job", help="job name (as `perseusctl jobs` shows it)")
    priority.add_argument("tier", choices=[*PRIORITY_NAMES, "0", "1", "2"], help="low, normal or high")
    add_model_parser(actions)


def run_set(args: argparse.Namespace) -> int:
    reply = ask(Path(args.runtime_dir), AdminSetCap(budget_w=args.node), CapStatusReply, admin=True)
    print(render_cap(reply))
    return EXIT_OK if reply.feasible else EXIT_FAILED


def run_clear(args: argparse.Namespace) -> int:
    reply = ask(Path(args.runtime_dir), AdminClearCap(), CapStatusReply, admin=True)
    print(render_cap(reply))
    return EXIT_OK


def run_priority(args: argparse.Namespace) -> int:
    tier = PRIORITY_NAMES[args.tier] if args.tier in PRIORITY_NAMES else int(args.tier)
    request = AdminSetJobPriority(job=args.job, priority=tier)
    reply = ask(Path(args.runtime_dir), request, JobPriorityOk, admin=True)
    print(f"job {reply.job}: priority {TIER_NAMES[reply.priority]} ({reply.priority})")
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    runtime_dir = Path(args.runtime_dir)

    def render() -> str:
        reply = ask(runtime_dir, AdminCapStatus(), CapStatusReply, admin=True)
        return json.dumps(cap_json(reply), indent=2) if args.json else render_cap(reply)

    if args.watch is None:
        print(render())
        return EXIT_OK
    return watch(render, args.watch, clear=not args.json)


def cap_json(reply: CapStatusReply) -> dict[str, Any]:
    """The documented JSON form: every field of the reply (None -> null), and `limits_sum_w`."""
    body = dataclasses.asdict(reply)
    body.pop("TYPE", None)
    body["limits_sum_w"] = limits_sum_w(reply)
    return body


def _watts(value: float | None) -> str:
    return PLACEHOLDER if value is None else f"{value:.0f} W"


def limits_sum_w(reply: CapStatusReply) -> float | None:
    """The sum of the power limits the cap holds: the most the node's GPUs can draw (None: none held)."""
    held = [g.limit_w for g in reply.gpus if g.limit_w is not None]
    return sum(held) if held else None


def _strict_note(reply: CapStatusReply) -> str:
    """What the limits guarantee: `limits sum 1,180 W <= grant (hard line)` or `> grant (held on measured
    window power)`."""
    total_w = limits_sum_w(reply)
    if total_w is None or reply.grant_w is None:
        return ""
    if total_w <= reply.grant_w + 0.5:
        return f"   limits sum {_watts(total_w)} <= grant (hard line)"
    return f"   limits sum {_watts(total_w)} > grant (the grant is held on measured window power)"


def render_cap(reply: CapStatusReply) -> str:
    """The cap as a few lines and two tables (GPUs, jobs)."""
    if not reply.active:
        head = "power cap: none (GPUs at their own power limits)"
    else:
        source = f"node budget {_watts(reply.budget_w)}"
        if reply.pool_grant_w is not None:
            source += f", pool grant {_watts(reply.pool_grant_w)}"
        head = f"power cap: {_watts(reply.grant_w)} ({source}; set by {reply.set_by or PLACEHOLDER})"
    lines = [
        head,
        f"measured {_watts(reply.measured_w)} over {reply.measured_span_s:.1f} s "
        f"(window {reply.window_s:g} s)   planned {_watts(reply.planned_w)} "
        f"(aim {_watts(reply.plan_target_w)})   "
        f"floor {_watts(reply.floor_w)}   demand {_watts(reply.demand_w)}",
        f"enforcement {reply.enforcement}{_strict_note(reply)}"
        + (f"   {reply.over_windows} window(s) over the grant" if reply.over_windows else ""),
    ]
    if not reply.feasible:
        lines.append(f"INFEASIBLE: {reply.problem}")
    elif reply.problem:
        lines.append(f"note: {reply.problem}")
    rows = [["GPU", "LIMIT", "MIN", "MAX", "FOLLOWS"]] + [
        [g.uuid, _watts(g.limit_w), fmt(g.min_w), fmt(g.max_w), g.managed_by or PLACEHOLDER]
        for g in reply.gpus
    ]
    lines += ["", *format_table(rows)]
    if reply.jobs:
        jobs = [["JOB", "PRIORITY", "POINT", "TIME", "UNCAPPED", "SLOWDOWN", "POWER"]] + [
            [
                j.job,
                TIER_NAMES.get(j.priority, str(j.priority)),
                str(j.point),
                f"{fmt(j.time_s * 1e3, 1)} ms",
                f"{j.uncapped_point} ({fmt(j.uncapped_time_s * 1e3, 1)} ms)",
                fmt_pct(j.slowdown, sign=True),
                _watts(j.power_w),
            ]
            for j in reply.jobs
        ]
        lines += ["", *format_table(jobs)]
    return "\n".join(lines)

"""`perseusctl cap-pool set|clear|release|status --pool NAME` (admin): a cluster power pool's budget, through
the admin socket of a daemon configured with the pool's etcd (the daemon logs who made each change).

    perseusctl cap-pool set --pool NAME --budget WATTS
    perseusctl cap-pool clear --pool NAME
    perseusctl cap-pool release --pool NAME NODE   # an absent node's reservation (its GPUs draw nothing)
    perseusctl cap-pool status --pool NAME [--json]

`set_pool_budget`, `fetch_pool_status` and `format_pool_status` are what a `perseusctl cap ... --pool`
front end calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from perseus_client import pool_messages as pool_msg

from perseusd.ctl.arguments import add_action, add_json_option
from perseusd.ctl.daemon_link import ask

if TYPE_CHECKING:
    from perseusd.ctl.arguments import Run, Subparsers

HELP = "admin: a cluster power pool's budget (etcd)"
EXIT_OK = 0
EXIT_USAGE = 2
TIMEOUT_S = 10.0
"""The daemon answers after etcd did (a try on each endpoint)."""
RELEASE_HELP = (
    "end an absent node's reservation (its grant goes to the others): only once its GPUs draw nothing "
    "(powered off, fenced, limits reset); refused for a node that reports"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    set_parser = _add_pool_action(actions, "set", "set the pool's budget", run_set)
    set_parser.add_argument("--budget", type=float, required=True, metavar="WATTS")
    _add_pool_action(actions, "clear", "remove the pool's budget (every node uncapped)", run_clear)
    release_parser = _add_pool_action(actions, "release", RELEASE_HELP, run_release)
    release_parser.add_argument("node", metavar="NODE")
    status_parser = _add_pool_action(
        actions, "status", "budget, grants, demand, floor and power per node", run_status
    )
    add_json_option(status_parser, help=None)


def _add_pool_action(actions: Subparsers, name: str, help: str, run: Run) -> argparse.ArgumentParser:
    """An action on one pool: `--pool NAME` comes first."""
    parser = add_action(actions, name, help, run)
    parser.add_argument("--pool", required=True)
    return parser


def set_pool_budget(runtime_dir: Path, pool: str, budget_w: float | None) -> pool_msg.PoolBudgetOk:
    request = pool_msg.AdminPoolSetBudget(pool=pool, budget_w=budget_w)
    return ask(runtime_dir, request, pool_msg.PoolBudgetOk, admin=True, timeout_s=TIMEOUT_S)


def fetch_pool_status(runtime_dir: Path, pool: str) -> pool_msg.PoolStatusReply:
    return ask(
        runtime_dir,
        pool_msg.AdminPoolStatus(pool=pool),
        pool_msg.PoolStatusReply,
        admin=True,
        timeout_s=TIMEOUT_S,
    )


def run_set(args: argparse.Namespace) -> int:
    if not math.isfinite(args.budget) or args.budget < 0:
        print("perseusctl cap-pool set: --budget must be a finite number of watts >= 0")
        return EXIT_USAGE
    reply = set_pool_budget(Path(args.runtime_dir), args.pool, args.budget)
    print(f"pool {reply.pool}: budget {reply.budget_w:.1f} W requested (by {reply.by})")
    return EXIT_OK


def run_clear(args: argparse.Namespace) -> int:
    reply = set_pool_budget(Path(args.runtime_dir), args.pool, None)
    print(f"pool {reply.pool}: budget cleared (by {reply.by})")
    return EXIT_OK


def run_release(args: argparse.Namespace) -> int:
    request = pool_msg.AdminPoolRelease(pool=args.pool, node=args.node)
    reply = ask(Path(args.runtime_dir), request, pool_msg.PoolReleaseOk, admin=True, timeout_s=TIMEOUT_S)
    print(
        f"pool {reply.pool}: node {reply.node}'s reservation of {reply.released_w:.1f} W released "
        f"(by {reply.by}); its share goes to the other nodes"
    )
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    reply = fetch_pool_status(Path(args.runtime_dir), args.pool)
    if args.json:
        print(json.dumps(dataclasses.asdict(reply), indent=2))
    else:
        print(format_pool_status(reply))
    return EXIT_OK


def format_pool_status(reply: pool_msg.PoolStatusReply) -> str:
    """The pool as a table (W)."""
    lines = [
        f"pool {reply.pool} (etcd revision {reply.revision}, allocator {reply.allocator or '-'})",
        f"budget: requested {_w(reply.requested_w)}"
        + (f" by {reply.requested_by}" if reply.requested_by else "")
        + (f" {reply.requested_age_s:.0f} s ago" if reply.requested_age_s is not None else "")
        + (f" ({reply.signal})" if reply.signal and reply.signal != "fresh" else "")
        + f", active {_w(reply.active_w)}, granted {reply.granted_w:.1f} W",
    ]
    if reply.problem:
        lines.append(f"CANNOT BE MET: {reply.problem}")
    lines.append(f"{'node':<24} {'grant':>9} {'applied':>9} {'power':>9} {'demand':>9} {'floor':>9}")
    for n in reply.nodes:
        lines.append(
            f"{n.node:<24} {_w(n.grant_w):>9} {_w(n.applied_w):>9} {_w(n.power_w):>9} "
            f"{n.demand_w:>8.1f}W {n.floor_w:>8.1f}W" + ("  ABSENT" if n.reserved_w is not None else "")
        )
    lines += [_absent_line(reply.pool, n) for n in reply.nodes if n.reserved_w is not None]
    return "\n".join(lines)


def _absent_line(pool: str, node: pool_msg.PoolNode) -> str:
    since = ""
    if node.absent_since_s is not None:
        since = time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(node.absent_since_s))
    return (
        f"node {node.node} is absent{since}: {node.reserved_w:.1f} W stay reserved (its GPUs may still draw "
        f"them) until it returns or `perseusctl cap-pool release --pool {pool} {node.node}`"
    )


def _w(value_w: float | None) -> str:
    return "-" if value_w is None else f"{value_w:.1f}W"

"""`perseusctl straggler JOB --pipeline P (--factor F | --clear) [--json]`: announce a straggler pipeline.

For a slowdown the daemon cannot see in time from the step events, known from outside (thermal throttling or
a degraded link reported by the cluster's health checks): pipeline P of the job is taken to run F times its
plan's time, and the job's other pipelines move to the least-energy plan that is no slower. `--clear`
withdraws it. The job's owner or an admin may announce; with a cluster plane the announcement reaches the
job's other nodes too. The daemon's own detection and announcements show in `perseusctl jobs`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from perseus_client.protocol import AnnounceStraggler, AnnounceStragglerOk

from perseusd.argtypes import factor_float, non_negative_int
from perseusd.ctl.arguments import add_job_argument, add_json_option
from perseusd.ctl.daemon_link import ask

HELP = "announce (or clear) a straggler pipeline of a job"
DESCRIPTION = (
    "Tell perseusd that a data-parallel pipeline of a job runs slower than its plan by a known factor, so "
    "that the job's other pipelines slow down to it and save energy."
)
EXIT_OK = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_argument(parser)
    parser.add_argument(
        "--pipeline",
        type=non_negative_int,
        required=True,
        metavar="P",
        help="the straggler pipeline (from 0)",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--factor",
        type=factor_float,
        metavar="F",
        help="its iterations take F times its plan's time (>= 1, e.g. 1.2)",
    )
    action.add_argument("--clear", action="store_true", help="withdraw the announcement")
    add_json_option(parser, "print the daemon's reply as JSON")


def announce(runtime_dir: Path, job: str, pipeline: int, factor: float | None) -> AnnounceStragglerOk:
    """Send the announcement (`factor` None: clear it); the daemon checks the job and who asks."""
    request = AnnounceStraggler(
        job=job, pipeline=pipeline, factor=1.0 if factor is None else factor, clear=factor is None
    )
    return ask(runtime_dir, request, AnnounceStragglerOk, admin=False)


def render_reply(reply: AnnounceStragglerOk) -> str:
    """`job j1: pipeline 0 announced as a straggler (x1.20); shared with the cluster`, or `... cleared`."""
    what = "straggler cleared" if reply.clear else f"announced as a straggler (x{reply.factor:.2f})"
    where = "shared with the cluster" if reply.shared else "this node only"
    return f"job {reply.job}: pipeline {reply.pipeline} {what}; {where}"


def run(args: argparse.Namespace) -> int:
    """Announce or clear, then print the daemon's confirmation."""
    factor = None if args.clear else args.factor
    reply = announce(Path(args.runtime_dir), args.job, args.pipeline, factor)
    print(json.dumps(dataclasses.asdict(reply), indent=2) if args.json else render_reply(reply))
    return EXIT_OK

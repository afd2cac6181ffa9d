"""`perseusctl slurm prolog|epilog|jobs`: a Slurm job's GPU energy on this node (docs/slurm.md).

`prolog` and `epilog` are what slurmd runs (Prolog= and Epilog= in slurm.conf, as root), reading the job from
slurmd's environment (SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GPUS). They never fail the job: a daemon that
does not answer is reported on stderr and the exit status stays 0 (a failing prolog or epilog would drain
the node), unless `--strict`. The epilog prints the job's record on one line (slurmd's log) and appends it,
as one JSON object, to `--record FILE` when given. `jobs` lists the jobs this caller may see.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perseus_client import slurm_messages as slurm_msg

from perseusd.ctl.arguments import add_json_option
from perseusd.ctl.daemon_link import DaemonRequestError, ask
from perseusd.ctl.terminal import PLACEHOLDER, fmt_duration, format_table
from perseusd.errors import PerseusError

HELP = "Slurm jobs' GPU energy; the prolog and epilog slurmd runs"
EXIT_OK = 0
EXIT_FAILED = 1
EPILOG_TIMEOUT_S = 30.0
"""The epilog restores GPUs a killed job left leased: more than a status's few seconds."""
HEADER = ("SLURM JOB", "UID", "STATE", "GPUS", "LEASED", "ALLOCATED", "TIME", "LEASES", "ID FROM", "RELEASED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="slurm_command", required=True)
    prolog = commands.add_parser("prolog", help="slurmd's Prolog=: declare the job's GPUs to perseusd")
    epilog = commands.add_parser("epilog", help="slurmd's Epilog=: close the job's record, release leftovers")
    epilog.add_argument("--record", type=Path, help="append the job's record (one JSON line) to this file")
    for sub in (prolog, epilog):
        sub.add_argument("--strict", action="store_true", help="fail (exit 1) when perseusd does not answer")
    jobs = commands.add_parser("jobs", help="the Slurm jobs' GPU energy on this node")
    add_json_option(jobs)


def run(args: argparse.Namespace) -> int:
    runtime_dir = Path(args.runtime_dir)
    if args.slurm_command == "jobs":
        records = fetch_slurm_jobs(runtime_dir)
        as_json = {"slurm_jobs": slurm_jobs_json(records)}
        print(json.dumps(as_json, indent=2) if args.json else render(records))
        return EXIT_OK
    try:
        if args.slurm_command == "prolog":
            _prolog(runtime_dir)
        else:
            _epilog(runtime_dir, args.record)
    except PerseusError as exc:
        print(f"perseusctl slurm {args.slurm_command}: {exc}", file=sys.stderr)
        return EXIT_FAILED if args.strict else EXIT_OK
    return EXIT_OK


def _prolog(runtime_dir: Path) -> None:
    job, uid, minors = prolog_inputs(os.environ)
    request = slurm_msg.AdminSlurmProlog(job=job, uid=uid, gpu_minors=minors)
    record = ask(runtime_dir, request, slurm_msg.SlurmJobOk, admin=True).record
    print(f"perseusd: Slurm job {job}: GPUs {', '.join(record.gpus) or 'none'}", file=sys.stderr)


def _epilog(runtime_dir: Path, record_file: Path | None) -> None:
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        raise PerseusError("SLURM_JOB_ID is not set: run this as slurmd's Epilog=")
    request = slurm_msg.AdminSlurmEpilog(job=int(job))
    record = ask(runtime_dir, request, slurm_msg.SlurmJobOk, admin=True, timeout_s=EPILOG_TIMEOUT_S).record
    print(summary(record), file=sys.stderr)
    if record_file is not None:
        with record_file.open("a") as out:
            out.write(json.dumps(dataclasses.asdict(record)) + "\n")


def prolog_inputs(environ: Mapping[str, str]) -> tuple[int, int, tuple[int, ...]]:
    """(job, uid, GPU minors) from slurmd's prolog environment."""
    job, uid = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_JOB_UID", "0")
    if not job.isdigit() or not uid.isdigit():
        raise PerseusError("SLURM_JOB_ID / SLURM_JOB_UID are not set: run this as slurmd's Prolog=")
    gpus = environ.get("SLURM_JOB_GPUS", "").strip()
    try:
        minors = tuple(int(g) for g in gpus.split(",") if g.strip()) if gpus else ()
    except ValueError:
        raise PerseusError(f"SLURM_JOB_GPUS={gpus}: not a list of GPU indices") from None
    return int(job), int(uid), minors


def fetch_slurm_jobs(runtime_dir: Path, *, quiet: bool = False) -> tuple[slurm_msg.SlurmJobEnergy, ...]:
    """The Slurm jobs the caller may see (an admin through the admin socket: all). `quiet`: none from a
    daemon that does not know the request (older than protocol 6.5)."""
    admin = os.access(runtime_dir / "admin.sock", os.W_OK)
    try:
        return ask(runtime_dir, slurm_msg.SlurmJobsRequest(), slurm_msg.SlurmJobsReply, admin=admin).jobs
    except DaemonRequestError as exc:
        if quiet and exc.code in ("UNKNOWN_TYPE", "VERSION_MISMATCH"):
            return ()
        raise


def slurm_jobs_json(records: Sequence[slurm_msg.SlurmJobEnergy]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(record) for record in records]


def summary(record: slurm_msg.SlurmJobEnergy) -> str:
    allocated = PLACEHOLDER if record.allocated_energy_j is None else f"{record.allocated_energy_j:.1f} J"
    released = ", ".join(record.released_at_end) or "nothing"
    return (
        f"perseusd: Slurm job {record.job} {record.state}: GPU energy {record.leased_energy_j:.1f} J leased, "
        f"{allocated} allocated, over {fmt_duration(record.duration_s)}; released {released}"
    )


def render(records: Sequence[slurm_msg.SlurmJobEnergy]) -> str:
    if not records:
        return "no Slurm jobs"
    rows = [
        (
            str(r.job),
            str(r.uid),
            r.state,
            str(len(r.gpus)),
            f"{r.leased_energy_j:.1f} J",
            PLACEHOLDER if r.allocated_energy_j is None else f"{r.allocated_energy_j:.1f} J",
            fmt_duration(r.duration_s),
            str(r.leases),
            r.source or PLACEHOLDER,
            ", ".join(r.released_at_end) or PLACEHOLDER,
        )
        for r in records
    ]
    return "\n".join(format_table([HEADER, *rows]))

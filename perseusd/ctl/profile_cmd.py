"""`perseusctl profile export JOB [-o FILE]` and `perseusctl profile import JOB FILE [--p-block-w W]`.

Profiles travel as CSV text in the format of `perseusd.planner.profile_csv` (the daemon never opens a path).
An import is checked here first, with the same strict reader the planner uses: a bad file lists every
problem as `file:line: column 'name': problem` and nothing is sent. An export goes to stdout, or to a file
written atomically (temporary file in the same folder, fsync, rename).
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import sys
from pathlib import Path

from perseus_client.protocol import ProfileExport, ProfileImport, ProfileImportOk, ProfileReply

from perseusd.ctl.arguments import add_action, add_job_argument
from perseusd.ctl.daemon_link import DOCUMENT_TIMEOUT_S, ask
from perseusd.errors import PerseusError, ProfileError

HELP = "export or import a job's measured profile (CSV)"
DESCRIPTION = (
    "A job's profile as CSV (stage,instruction,frequency,time,energy): export it to reuse it, import one so "
    "that the job skips online profiling (and solves again if it already runs)."
)
EXIT_OK = 0
MAX_PROBLEMS_SHOWN = 20


def _power_w(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number (watts)") from None
    if not math.isfinite(value) or value < 0.0:
        raise argparse.ArgumentTypeError(f"must be a finite number of watts >= 0 (got {text})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`profile export` and `profile import`."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = add_action(actions, "export", "write a job's profile as CSV", run_export)
    add_job_argument(export)
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    imp = add_action(
        actions,
        "import",
        "give a job its profile so that it skips profiling (checked here first)",
        run_import,
    )
    add_job_argument(imp, "the job's name (it may register later)")
    imp.add_argument("file", metavar="FILE", help="profile CSV: stage,instruction,frequency,time,energy")
    imp.add_argument(
        "--p-block-w",
        type=_power_w,
        default=0.0,
        metavar="W",
        help="GPU power while blocked on communication (default 0: keep the job's measured value; "
        "a job that has not registered yet needs it)",
    )


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PerseusError(f"cannot write {path}: {exc.strerror or exc}") from None


def _data_rows(csv_text: str) -> int:
    return sum(1 for line in csv_text.splitlines()[1:] if line.strip())


def run_export(args: argparse.Namespace) -> int:
    """Print the job's profile, or write it to `--output` and say what was written."""
    request = ProfileExport(job=args.job)
    reply = ask(Path(args.runtime_dir), request, ProfileReply, admin=False, timeout_s=DOCUMENT_TIMEOUT_S)
    if args.output is None:
        sys.stdout.write(reply.csv)
        return EXIT_OK
    write_atomically(Path(args.output), reply.csv)
    print(
        f"wrote {args.output}: {_data_rows(reply.csv)} rows of job {reply.job}, "
        f"blocking power {reply.p_block_w:g} W (import with --p-block-w {reply.p_block_w:g})"
    )
    return EXIT_OK


def checked_profile_text(path: str) -> str:
    """The text of a valid profile file; raises `PerseusError` after listing every problem on stderr."""
    from perseusd.planner.profile_csv import check_profile

    try:
        problems = check_profile(path)
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise PerseusError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PerseusError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if problems:
        _report(problems)
        count = len(problems)
        raise PerseusError(f"{path}: {count} problem{'s' if count > 1 else ''}; nothing was sent to perseusd")
    return text


def _report(problems: list[ProfileError]) -> None:
    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        print(problem, file=sys.stderr)
    if len(problems) > MAX_PROBLEMS_SHOWN:
        print(f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more", file=sys.stderr)


def run_import(args: argparse.Namespace) -> int:
    """Check the file, then send its text; the daemon answers with the rows taken and the job's state."""
    text = checked_profile_text(args.file)
    request = ProfileImport(job=args.job, csv=text, source=args.file, p_block_w=args.p_block_w)
    reply = ask(Path(args.runtime_dir), request, ProfileImportOk, admin=False, timeout_s=DOCUMENT_TIMEOUT_S)
    print(f"imported {reply.rows} rows from {args.file} into job {reply.job} (now {reply.state})")
    return EXIT_OK

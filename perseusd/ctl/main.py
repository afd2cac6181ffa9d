"""`perseusctl` entry point: parses the command line and dispatches to one module per command.

Each command module exposes `register(subparsers)`, which adds its parser and sets `func` to a callable
taking the parsed arguments and returning the exit code. Exit codes: 0 ok, 1 command failed, 2 daemon
unreachable (or usage error). Errors are one line on stderr; tracebacks only with `--debug`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from perseusd import __version__
from perseusd.errors import PerseusError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREACHABLE = 2

# Command modules under `perseusd.ctl`, in help order. Each defines `register(subparsers)`.
COMMAND_MODULES: tuple[str, ...] = (
    "solve_cmd",
    "compare_cmd",
    "status_cmd",
    "reset_cmd",
    "jobs_cmd",
    "frontier_cmd",
    "plan_cmd",
    "profile_cmd",
    "straggler_cmd",
    "stragglers_cmd",
    "measure_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The full `perseusctl` parser with every command registered."""
    parser = argparse.ArgumentParser(
        prog="perseusctl", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--version", action="version", version=f"perseusctl {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument(
        "--runtime-dir", default="/run/perseusd", help="the daemon's runtime directory (default: %(default)s)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"perseusd.ctl.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `perseusctl`; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s"
    )
    func: Callable[[Any], int] = args.func
    try:
        return func(args)
    except PerseusError as exc:
        if args.debug:
            raise
        print(f"perseusctl: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

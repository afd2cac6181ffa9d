"""`perseusctl` entry point: parses the command line and dispatches to one module per command.

Each command module states its help, its arguments and its `run` (`perseusd.ctl.arguments`), from which
`build_parser` adds the command; the parsed arguments' `func` returns the exit code. Only the module of the
command being run is imported (all of them for help or a usage error), so `solve` never loads the client
library and zmq and `status` never loads numpy. Exit codes: 0 ok, 1 command failed, 2 daemon unreachable (or
usage error). Errors are one line on stderr; tracebacks only with `--debug`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from perseusd import __version__
from perseusd.ctl.arguments import add_command
from perseusd.ctl.terminal import safe_output
from perseusd.errors import PerseusError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREACHABLE = 2
EXIT_BROKEN_PIPE = 141
"""What a shell reports for a command killed by SIGPIPE: the reader of its output went away."""

# Command name -> module under `perseusd.ctl`, in help order (what each defines: `perseusd.ctl.arguments`).
COMMANDS: dict[str, str] = {
    "solve": "solve_cmd",
    "compare": "compare_cmd",
    "status": "status_cmd",
    "reset": "reset_cmd",
    "jobs": "jobs_cmd",
    "frontier": "frontier_cmd",
    "plan": "plan_cmd",
    "profile": "profile_cmd",
    "straggler": "straggler_cmd",
    "stragglers": "stragglers_cmd",
    "measure": "measure_cmd",
    "cap-pool": "cap_pool_cmd",
    "cap": "cap_cmd",
    "slurm": "slurm_cmd",
}
COMMAND_MODULES: tuple[str, ...] = tuple(COMMANDS.values())
_OPTIONS_WITH_VALUE = ("--runtime-dir",)


def command_in(argv: Sequence[str]) -> str | None:
    """The command named on a command line (skipping the global options), or None if there is none."""
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
        elif arg in _OPTIONS_WITH_VALUE:
            skip_value = True
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


DESCRIPTION = (
    "The command line of Perseus: see GPUs, jobs and their plans, measure energy, set power caps and plan "
    "offline from a profile. `perseusctl COMMAND --help` describes each command."
)
EPILOG = "Exit codes: 0 ok, 1 the command failed, 2 the daemon is unreachable or a usage error."
RUNTIME_DIR_ENV = "PERSEUSD_RUNTIME_DIR"
DEFAULT_RUNTIME_DIR = "/run/perseusd"
"""As `perseus_client.reach` has them (not imported here: `perseusctl solve` never loads the client)."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `perseusctl` parser: every command registered, or only the command `only`."""
    parser = argparse.ArgumentParser(prog="perseusctl", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"perseusctl {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument(
        "--runtime-dir",
        default=os.environ.get(RUNTIME_DIR_ENV) or DEFAULT_RUNTIME_DIR,
        help=f"the daemon's runtime directory (default: ${RUNTIME_DIR_ENV}, else {DEFAULT_RUNTIME_DIR}; "
        "now %(default)s)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command, module in COMMANDS.items():
        if only is None or command == only:
            add_command(subparsers, command, importlib.import_module(f"perseusd.ctl.{module}"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `perseusctl`; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_in(argv)).parse_args(argv)
    _configure_logging(args.debug)
    func: Callable[[Any], int] = args.func
    with safe_output():
        return _run(func, args)


def _run(func: Callable[[Any], int], args: Any) -> int:
    try:
        code = func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:  # `perseusctl status | head`: the reader left; no traceback
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except PerseusError as exc:
        if args.debug:
            raise
        print(f"perseusctl: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130


def _configure_logging(debug: bool) -> None:
    """Warnings (everything with `--debug`) as one line each on stderr."""
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(message)s")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())

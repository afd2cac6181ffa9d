"""How a perseusctl command's parser is built, and the arguments that mean the same in several commands.

A command module (one per command, `COMMANDS` in `perseusd.ctl.main`) states what `add_command` needs:
`HELP`, its line in `perseusctl --help`; `DESCRIPTION`, the head of its own `--help` (optional);
`add_arguments(parser)`; and `run(args)`, returning the exit code. A command with actions (`profile export`,
`cap set`) has no `run`: `add_action` gives each action its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
    Run: TypeAlias = Callable[[argparse.Namespace], int]

JSON_TABLE_HELP = "print JSON instead of a table"


def add_command(subparsers: Subparsers, name: str, module: ModuleType) -> None:
    """Add the command `name`, as its module states it."""
    description: str | None = getattr(module, "DESCRIPTION", None)
    parser = subparsers.add_parser(name, help=module.HELP, description=description)
    module.add_arguments(parser)
    if hasattr(module, "run"):
        parser.set_defaults(func=module.run)


def add_action(
    actions: Subparsers, name: str, help: str, run: Run, description: str | None = None
) -> argparse.ArgumentParser:
    """Add an action of a command (`cap set`) that `run` carries out; returns its parser."""
    parser = actions.add_parser(name, help=help, description=description)
    parser.set_defaults(func=run)
    return parser


def add_job_argument(parser: argparse.ArgumentParser, help: str = "the job's name") -> None:
    """The positional `JOB`: a job's name as `perseusctl jobs` shows it."""
    parser.add_argument("job", metavar="JOB", help=help)


def add_json_option(parser: argparse.ArgumentParser, help: str | None = JSON_TABLE_HELP) -> None:
    """`--json`: print the command's result as JSON (on stdout) instead of text."""
    parser.add_argument("--json", action="store_true", help=help)


def add_plot_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--plot PNG`: also draw the result to an image file (matplotlib, imported only then)."""
    parser.add_argument("--plot", metavar="PNG", help=help)

"""The inputs `perseusctl solve` and `perseusctl compare` share: profile, schedule and solver parameters.

Import-light on purpose: the planner modules are imported when the command runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perseusd.argtypes import non_negative_float, positive_float, positive_int
from perseusd.errors import PlanningError
from perseusd.planner.schedules import NAMES as SCHEDULE_NAMES

if TYPE_CHECKING:
    from perseusd.planner.dag import ComputationDag
    from perseusd.planner.profile import Profile

DEFAULT_UNIT_TIME_S = 0.001
DEFAULT_FACTORS = (1.05, 1.1, 1.2, 1.5)
"""The straggler factors `compare` and `stragglers` account for unless told."""
BUNDLED_NAMES = ("a100_sxm", "a40", "h100_sxm")
"""Bundled profile names (kept in sync with `perseusd.planner.bundled.BUNDLED_PROFILES` by a test)."""


@dataclass(frozen=True)
class PlanningInputs:
    """Everything a planning command works on."""

    profile: Profile
    dag: ComputationDag
    unit_time_s: float
    p_block_w: float

    def to_json(self) -> dict[str, Any]:
        """What was planned, as the commands' `--json` documents state it."""
        return {
            "profile": self.profile.source,
            "schedule": self.dag.schedule,
            "stages": self.dag.num_stages,
            "microbatches": self.dag.num_microbatches,
            "chunks": self.dag.num_chunks,
            "unit_time_s": self.unit_time_s,
            "p_block_w": self.p_block_w,
        }


def add_planning_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the profile, schedule and solver parameter options to a command's parser."""
    parser.add_argument(
        "--profile",
        required=True,
        metavar="FILE",
        help=f"profile CSV file, or a bundled profile name ({', '.join(BUNDLED_NAMES)})",
    )
    parser.add_argument("--stages", type=positive_int, required=True, metavar="S", help="pipeline stages")
    parser.add_argument(
        "--microbatches", type=positive_int, required=True, metavar="M", help="microbatches per iteration"
    )
    parser.add_argument("--schedule", choices=SCHEDULE_NAMES, default="1f1b", help="default: %(default)s")
    parser.add_argument(
        "--chunks",
        type=positive_int,
        default=1,
        metavar="V",
        help="model chunks per stage (interleaved schedules; zbv: 2)",
    )
    parser.add_argument(
        "--unit-time",
        type=positive_float,
        default=DEFAULT_UNIT_TIME_S,
        metavar="SECONDS",
        help="the solver's time unit, in the profile's time unit (default: %(default)s)",
    )
    parser.add_argument(
        "--p2p-power",
        type=non_negative_float,
        default=None,
        metavar="WATTS",
        help="GPU power while blocked on communication (default: the measured value for a bundled profile "
        "(a100_sxm 83.64, a40 70.38), else 0)",
    )


def add_factors_option(parser: argparse.ArgumentParser, factor: Callable[[str], float]) -> None:
    """`--factors K [K ...]`: straggler factors; `factor` parses one (each command words its own error)."""
    parser.add_argument(
        "--factors",
        type=factor,
        nargs="+",
        default=DEFAULT_FACTORS,
        metavar="K",
        help=f"straggler factors (default: {' '.join(map(str, DEFAULT_FACTORS))})",
    )


def load_inputs(args: argparse.Namespace) -> PlanningInputs:
    """Read the profile and build the DAG named by the parsed planning arguments."""
    from perseusd.planner.bundled import load_profile
    from perseusd.planner.dag import build_dag

    profile, bundled_p_block_w = load_profile(args.profile, args.schedule)
    dag = build_dag(args.schedule, args.stages, args.microbatches, args.chunks)
    needed = dag.num_stages * dag.num_chunks
    if profile.num_stages < needed:
        raise PlanningError(
            f"profile {profile.source} has {profile.num_stages} stages, "
            f"but {args.stages} stages x {args.chunks} chunks need {needed}"
        )
    return PlanningInputs(profile, dag, args.unit_time, blocking_power_w(args, bundled_p_block_w))


def blocking_power_w(args: argparse.Namespace, bundled_p_block_w: float | None) -> float:
    """`--p2p-power` when given, else a bundled profile's measured blocking power, else 0."""
    return args.p2p_power if args.p2p_power is not None else (bundled_p_block_w or 0.0)

"""A solve function for the solver worker process in tests (importable there by its module name)."""

from __future__ import annotations

import time

from perseusd.jobs.solving import Solved, SolveInput, solve


def slow_or_fast(task: SolveInput) -> Solved:
    """The job named "slow" sleeps 60 s before solving; any other solves at once."""
    if task.job == "slow":
        time.sleep(60)
    return solve(task)

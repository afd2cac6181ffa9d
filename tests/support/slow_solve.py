"""A solve function for the solver worker process in tests (importable there by its module name)."""

from __future__ import annotations

import time

from perseusd.jobs.solving import Solved, SolveInput, solve


def slow_or_fast(task: SolveInput) -> Solved:
    """The job named "slow" sleeps 60 s before solving; any other solves at once."""
    if task.job == "slow":
        time.sleep(60)
    return solve(task)


def greedy_or_fast(task: SolveInput) -> Solved:
    """The job named "greedy" holds 1 GiB before solving (past a small cap); any other solves at once."""
    if task.job == "greedy":
        held = bytearray(2**30)
        held[-1] = 1
    return solve(task)

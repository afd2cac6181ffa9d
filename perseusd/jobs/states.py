"""A job's states and the moves between them: the one place both are written down.

registered -> profiling -> solving -> running, with shortcuts (a cached frontier runs at once, a large one
once the solver worker has read it, in solving; an imported profile skips profiling), `failed` from any
active state and `ended` when the job's last GPU leaves. An imported profile solves a profiling, running or
failed job again. `ended` is final (registering the name again makes a new job). `Job.enter` refuses any
other move with `IllegalMoveError`.
"""

from __future__ import annotations

from collections.abc import Mapping

from perseus_client.codes import JobState

from perseusd.errors import PerseusError

REGISTERED = JobState.REGISTERED
PROFILING = JobState.PROFILING
SOLVING = JobState.SOLVING
RUNNING = JobState.RUNNING
ENDED = JobState.ENDED
FAILED = JobState.FAILED

MOVES: Mapping[JobState, frozenset[JobState]] = {
    REGISTERED: frozenset({PROFILING, SOLVING, RUNNING, FAILED, ENDED}),
    PROFILING: frozenset({SOLVING, FAILED, ENDED}),
    SOLVING: frozenset({RUNNING, FAILED, ENDED}),
    RUNNING: frozenset({SOLVING, FAILED, ENDED}),
    # A failed job solves again on an imported profile; a deployment failing late (a straggler's switch
    # after the job failed) keeps it failed, with the newer reason.
    FAILED: frozenset({SOLVING, FAILED}),
    ENDED: frozenset(),
}
"""The states each state may move to."""

ACTIVE = frozenset(state for state in JobState if state not in (ENDED, FAILED))
"""States of a job that still has work to do (the main loop polls soon while one exists)."""


class IllegalMoveError(PerseusError):
    """A job asked to move between states the state machine does not connect (a bug, never user input)."""

    def __init__(self, job: str, old: JobState, new: JobState) -> None:
        super().__init__(f"job {job}: no move from {old} to {new}")
        self.old = old
        self.new = new


def check_move(job: str, old: JobState, new: JobState) -> None:
    """Raise `IllegalMoveError` unless `old -> new` is a move of the state machine."""
    if new not in MOVES[old]:
        raise IllegalMoveError(job, old, new)

"""A job's states: one enum, shared with the protocol; moves outside the state machine are refused."""

from __future__ import annotations

import pytest
from perseus_client.codes import JobState
from perseus_client.message import JOB_STATES
from perseus_client.protocol import RegisterOk, decode, encode

from perseusd.jobs.job import Job
from perseusd.jobs.shape import JobShape
from perseusd.jobs.states import ACTIVE, MOVES, IllegalMoveError, check_move
from perseusd.planner.policy import Policy


def new_job() -> Job:
    return Job("train", 1000, JobShape("1f1b", 2, 4, 1), "A100", "sig", Policy())


def test_the_protocol_carries_the_enums_strings() -> None:
    assert tuple(state.value for state in JobState) == JOB_STATES
    assert set(MOVES) == set(JobState)
    data = encode(RegisterOk(job="train", state=JobState.RUNNING, cached=False), 1)
    assert b'"state":"running"' in data
    reply = decode(data, 1 << 20, 0).message
    assert isinstance(reply, RegisterOk)
    assert reply.state == JobState.RUNNING


def test_a_job_walks_the_usual_path() -> None:
    job = new_job()
    assert job.state is JobState.REGISTERED
    for state in (JobState.PROFILING, JobState.SOLVING, JobState.RUNNING, JobState.ENDED):
        job.enter(state)
        assert job.state is state
    assert not job.active


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (JobState.PROFILING, JobState.RUNNING),  # nothing solved yet
        (JobState.PROFILING, JobState.REGISTERED),
        (JobState.ENDED, JobState.RUNNING),  # ended is final
        (JobState.ENDED, JobState.FAILED),
        (JobState.FAILED, JobState.RUNNING),  # only a new solve brings a failed job back
        (JobState.RUNNING, JobState.RUNNING),
        (JobState.SOLVING, JobState.PROFILING),
    ],
)
def test_a_move_outside_the_machine_is_refused(old: JobState, new: JobState) -> None:
    job = new_job()
    job.state = old
    with pytest.raises(IllegalMoveError, match=f"job train: no move from {old} to {new}"):
        job.enter(new, "why")
    assert job.state is old
    assert job.error == ""


def test_every_active_state_can_fail_and_end_but_a_finished_one_cannot() -> None:
    for state in ACTIVE:
        check_move("j", state, JobState.FAILED)
        check_move("j", state, JobState.ENDED)
    assert set(JobState) - {JobState.ENDED, JobState.FAILED} == ACTIVE
    assert MOVES[JobState.ENDED] == frozenset()

"""Limits without sockets: per-user sessions and connections, descriptor exhaustion reported as such, the
set_clock range, and why a job that ended while profiling ended."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from perseus_client.protocol import (
    ErrorCode,
    ProtocolError,
    Register,
    Release,
    SetClock,
)

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.limits import ConnectionBook, ConnectionLimits
from perseusd.errors import LimitReachedError, NotRegisteredError
from perseusd.jobs.settings import JobSettings
from perseusd.leasing.identity import Caller, checked_start_time
from perseusd.leasing.leases import LeaseBook
from tests.support.callers import ME
from tests.support.daemon_core import claim, core_job, core_jobs, sim_core


@pytest.fixture
def core(tmp_path: Path) -> Iterator[DaemonCore]:
    with sim_core(tmp_path, gpus=2, jobs=JobSettings()) as built:
        yield built


def test_sessions_per_user_are_capped_but_not_for_root() -> None:
    book = LeaseBook(max_sessions_per_user=1)
    try:
        book.register(Caller(uid=4242, gid=0, pid=os.getpid()), "a")
        with pytest.raises(LimitReachedError, match="per-user limit"):
            book.register(Caller(uid=4242, gid=0, pid=os.getppid()), "b")
        book.drop_session(os.getpid())
        book.register(Caller(uid=4242, gid=0, pid=os.getppid()), "b")  # a slot is free again
    finally:
        book.close()
    root = LeaseBook(max_sessions_per_user=1)
    try:
        root.register(Caller(uid=0, gid=0, pid=os.getpid()), "a")
        root.register(Caller(uid=0, gid=0, pid=os.getppid()), "b")
        assert root.session_count == 2
    finally:
        root.close()


def test_out_of_descriptors_is_not_process_gone() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)  # the kernel hands out the lowest free descriptor
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # every descriptor below it is in use
    try:
        with pytest.raises(LimitReachedError, match="descriptors"):
            checked_start_time(os.getpid())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with pytest.raises(NotRegisteredError):
        checked_start_time(2**22 + 12345)  # above pid_max: no such process


def test_connection_book_budgets() -> None:
    sessions = [0]
    book = ConnectionBook(ConnectionLimits(per_user=2, total=4), lambda: sessions[0])
    assert book.accepted(10, 1000) is None
    assert book.accepted(11, 1000) is None
    assert "per-user limit" in (book.accepted(12, 1000) or "")
    assert book.accepted(13, 0) is None  # root has no per-user limit
    sessions[0] = 1  # registered processes hold descriptors too
    assert "in use" in (book.accepted(14, 2000) or "")
    assert book.refused == 2
    book.closed(10)
    book.closed(12)  # refused: never counted
    assert book.of_user(1000) == 1
    assert book.accepted(11, 3000) is None  # a descriptor number reused before its close was seen
    assert book.of_user(1000) == 0
    assert book.live == 2
    assert ConnectionLimits.for_descriptors(524_288).per_user == 512
    assert ConnectionLimits.for_descriptors(256).total == 128


def test_set_clock_refuses_what_set_plan_refuses(core: DaemonCore) -> None:
    gpu = core.registry.uuids[0]
    claim(core, ME, (gpu,), "t")
    clocks = core.registry.info(gpu).supported_sm_clocks_mhz
    for bad_mhz in (max(clocks) + 1, min(clocks) - 1, 0, -5):
        with pytest.raises(ProtocolError) as refused:
            core.handle(ME, SetClock(gpu=gpu, sm_clock_mhz=bad_mhz))
        assert refused.value.code == ErrorCode.BAD_FIELD
    core.handle(ME, SetClock(gpu=gpu, sm_clock_mhz=max(clocks)))
    core.handle(ME, Release(gpus=()))


def test_job_that_ends_while_profiling_says_why(core: DaemonCore) -> None:
    gpus = core.registry.uuids
    claim(core, ME, gpus, "t")
    for stage, gpu in enumerate(gpus):
        core.handle(ME, Register(gpu, "prof", 0, stage, 2, 4, "1f1b", 1))
    assert core_job(core).state == "profiling"
    core.handle(ME, Release(gpus=()))
    (job,) = core_jobs(core)
    assert job.state == "ended"
    assert "while it was profiling" in job.error
    assert "import a profile" in job.error


def test_registration_out_of_range_creates_no_job(core: DaemonCore) -> None:
    gpu = core.registry.uuids[0]
    claim(core, ME, (gpu,), "t")
    for pipeline in (2**62, 1_000_001, -1):
        with pytest.raises(ProtocolError) as refused:
            core.handle(ME, Register(gpu, "half", pipeline, 0, 1, 1, "1f1b", 1))
        assert refused.value.code == ErrorCode.BAD_FIELD
    assert core_jobs(core) == ()
    core.handle(ME, Release(gpus=()))

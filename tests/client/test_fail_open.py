"""Fail-open against real daemon processes: absent at start, killed, restarted; strict mode raises.

A fail-open client never raises into training because of the daemon: calls that change something are
counted no-ops while it is away, events are dropped and counted, release and close return, and when the
daemon (re)appears the client claims, registers and imports again by itself; a job found in the daemon's
cache runs its plan at once, without profiling.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator

import pytest
from perseus_client import PerseusClient, PerseusClientError
from perseus_client.codes import JobState
from perseus_client.job_info import JobInfo

from tests.support.perseusd_proc import (
    DaemonDirs,
    DaemonProcess,
    daemon_processes,
    daemon_side,
    sim_gpu_uuids,
)

pytestmark = pytest.mark.timeout(120)
# Runs on every Python the client supports (scripts/test_client_pythons.sh): the client library, pytest and
# pyzmq only; what needs the daemon's packages runs in the daemon's interpreter (`daemon_side`).

JOB = "fail-open"
STAGES = 2
MICROBATCHES = 4
PLAN_BACK_S = 5.0
"""The bar: the job runs its plan again within 5 s of the daemon's return."""


@pytest.fixture
def dirs() -> DaemonDirs:
    return DaemonDirs.create()


@pytest.fixture
def make() -> Iterator[Callable[..., DaemonProcess]]:
    with daemon_processes() as factory:
        yield factory


def _gpus(count: int = STAGES) -> list[str]:
    """The simulated GPUs' UUIDs, known before any daemon runs (as a real GPU's are)."""
    return sim_gpu_uuids(count)


PROFILE_CODE = """
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.synthetic import synthetic_profile
print(profile_to_csv(synthetic_profile(2, seed=3, clocks_mhz=tuple(range(1410, 885, -90)))), end="")
"""


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """A stage's computations in 1F1B order: warm-up forwards, forward/backward pairs, cool-down backwards."""
    warmup = min(stages - stage - 1, microbatches)
    order = [("forward", mb) for mb in range(warmup)]
    for mb in range(microbatches - warmup):
        order += [("forward", warmup + mb), ("backward", mb)]
    return order + [("backward", mb) for mb in range(microbatches - warmup, microbatches)]


def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> float:
    began_s = time.monotonic()
    while not check():
        assert time.monotonic() - began_s < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - began_s


def _job(client: PerseusClient) -> JobInfo | None:
    try:
        return next((job for job in client.jobs().jobs if job.job == JOB), None)
    except PerseusClientError:
        return None


def _iterate(client: PerseusClient, gpus: list[str], steps: range) -> None:
    for step in steps:
        for stage, gpu in enumerate(gpus):
            with client.step(gpu, step):
                for instruction, microbatch in one_f_one_b(stage, STAGES, MICROBATCHES):
                    with client.computation(gpu, stage, instruction, microbatch):
                        pass


def _join(client: PerseusClient, gpus: list[str]) -> None:
    """What a training job does at start: import its profile, claim, register every stage."""
    client.profile_import(daemon_side(PROFILE_CODE), source="test", p_block_w=80.0)
    client.claim(gpus)
    for stage, gpu in enumerate(gpus):
        client.register(gpu, stage=stage, num_stages=STAGES, num_microbatches=MICROBATCHES)


def test_absent_at_start_one_warning_no_ops_then_managed_when_it_appears(
    dirs: DaemonDirs, make: Callable[..., DaemonProcess], caplog: pytest.LogCaptureFixture
) -> None:
    gpus = _gpus()
    caplog.set_level(logging.WARNING, logger="perseus_client")
    began_s = time.monotonic()
    with PerseusClient(dirs.runtime_dir, job=JOB, timeout_s=10.0) as client:
        assert time.monotonic() - began_s < 5.0  # no daemon: known at once, no timeout waited
        assert not client.managed
        assert client.daemon_info is None
        _join(client, gpus)
        _iterate(client, gpus, range(3))
        assert client.calls_skipped == 4  # import, claim, two registrations
        assert client.events_dropped == 3 * STAGES * (2 * 2 * MICROBATCHES + 2)
        assert client.events_sent == 0
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "does not exist" in warnings[0].getMessage()
        with pytest.raises(PerseusClientError):  # a question has no answer to return
            client.status()

        daemon = make(dirs, gpus=STAGES).start()
        _eventually(lambda: client.reconnects == 1, "the client to open a session by itself")
        assert client.managed
        leases = {row["uuid"]: row["lease"] for row in daemon.status()["gpus"]}
        assert all(leases[gpu]["job"] == JOB for gpu in gpus)  # claimed while away: claimed now
        job = _job(client)
        assert job is not None
        assert job.profiling is None
        _eventually(  # the event socket reconnects on its own, within ZeroMQ's interval
            lambda: _iterate(client, gpus, range(3, 4)) or client.events_sent > 0, "events to flow again"
        )
        assert client.release() is not None


def test_killed_mid_run_release_and_close_return_at_once(
    dirs: DaemonDirs, make: Callable[..., DaemonProcess]
) -> None:
    gpus = _gpus(1)
    daemon = make(dirs, gpus=1).start()
    client = PerseusClient(dirs.runtime_dir, job=JOB, timeout_s=10.0)
    client.claim(gpus)
    client.set_clock(gpus[0], 1200)
    _iterate_one(client, gpus[0], 5)
    daemon.signal(signal.SIGKILL)
    daemon.wait()
    _eventually(lambda: not client.managed, "the client to notice the daemon is gone")
    began_s = time.monotonic()
    dropped = client.events_dropped
    _iterate_one(client, gpus[0], 100)
    assert client.events_dropped - dropped == 100 * 4
    assert client.set_clock(gpus[0], 1100) is None
    assert client.release() is None  # no raise, no wait
    client.close()
    # Below the shortest wait either could make: the settle's 3 s without progress, a 10 s request.
    assert time.monotonic() - began_s < 3.0
    assert client.calls_skipped == 2


def _iterate_one(client: PerseusClient, gpu: str, steps: int) -> None:
    for step in range(steps):
        with client.step(gpu, step), client.computation(gpu, 0, "forward", 0):
            pass


def test_restarted_daemon_gets_everything_back_and_runs_the_plan_without_profiling(
    dirs: DaemonDirs, make: Callable[..., DaemonProcess]
) -> None:
    gpus = _gpus()
    first = make(dirs, gpus=STAGES).start()
    with PerseusClient(dirs.runtime_dir, job=JOB, timeout_s=10.0) as client:
        _join(client, gpus)
        assert client.set_policy("slowdown", 0.05) is not None
        _eventually(lambda: _state(client) == JobState.RUNNING, "the plan", 60)
        before = _job(client)
        assert before is not None
        plan_before = client.plan()

        for sessions, stop in enumerate(
            (signal.SIGKILL, signal.SIGTERM), start=1
        ):  # a crash; a stop (upgrade)
            first.signal(stop)
            first.wait()
            _eventually(lambda: not client.managed, "the client to notice")
            _iterate(client, gpus, range(2))  # training goes on meanwhile
            first = make(dirs, gpus=STAGES).start()
            back_s = _eventually(lambda: _state(client) == JobState.RUNNING, "the plan back", 30)
            assert back_s < PLAN_BACK_S
            _eventually(
                lambda n=sessions: client.reconnects == n, "the replay to end"
            )  # the policy comes last
            after = _job(client)
            assert after is not None
            assert after.cached
            assert after.profiling is None
            assert (after.policy, after.target) == ("slowdown", 0.05)  # the policy was chosen again
            assert after.plan_index == before.plan_index
            assert client.plan()["stages"] == plan_before["stages"]


def _state(client: PerseusClient) -> str:
    job = _job(client)
    return "" if job is None else job.state


def test_strict_raises_when_absent_by_argument_and_by_environment(
    dirs: DaemonDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    began_s = time.monotonic()
    with pytest.raises(PerseusClientError) as info:
        PerseusClient(dirs.runtime_dir, timeout_s=0.3, strict=True)
    assert info.value.code == "UNREACHABLE"
    assert time.monotonic() - began_s < 3.0
    monkeypatch.setenv("PERSEUSD_CLIENT_STRICT", "1")
    with pytest.raises(PerseusClientError):
        PerseusClient(dirs.runtime_dir, timeout_s=0.3)
    client = PerseusClient(dirs.runtime_dir, timeout_s=0.3, strict=False)  # the argument wins
    client.close()


def test_strict_client_raises_on_release_when_the_daemon_is_gone(
    dirs: DaemonDirs, make: Callable[..., DaemonProcess]
) -> None:
    daemon = make(dirs, gpus=1).start()
    client = PerseusClient(dirs.runtime_dir, job=JOB, timeout_s=3.0, strict=True)
    try:
        client.claim(_gpus(1))
        daemon.signal(signal.SIGKILL)
        daemon.wait()
        with pytest.raises(PerseusClientError) as info:
            client.release()
        assert info.value.code == "UNREACHABLE"
    finally:
        client.close()


def test_a_refusal_is_a_warning_in_fail_open_mode(
    dirs: DaemonDirs, make: Callable[..., DaemonProcess], caplog: pytest.LogCaptureFixture
) -> None:
    make(dirs, gpus=1).start()
    with PerseusClient(dirs.runtime_dir, job=JOB) as client:
        caplog.set_level(logging.WARNING, logger="perseus_client")
        assert client.claim(["GPU-not-on-this-node"]) == ()
        assert client.register("GPU-not-leased", stage=0, num_stages=1, num_microbatches=1) is None
        assert client.calls_skipped == 2
        assert client.managed  # a refusal is not a lost daemon
        assert sum("refused" in r.getMessage() for r in caplog.records) == 2
        with pytest.raises(ValueError, match="pipeline"):  # wrong whatever the daemon says: raises
            client.announce_straggler(-1, 1.2)

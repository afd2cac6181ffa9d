"""Ended and failed jobs outlive a daemon restart: written as one `jobs` reply frame, read back by the next
run (with their time in state counted on), an unreadable file moved aside, never fatal."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from perseusd.daemon.past_jobs import PAST_JOBS_FILE, PastJobs
from tests.ctl.test_jobs_cmds import RUNNING

FAILED = dataclasses.replace(
    RUNNING, job="bert", state="failed", state_for_s=5.0, error="solving failed: the frontier is empty"
)
ENDED = dataclasses.replace(RUNNING, job="gpt3", uid=1001, state="ended", state_for_s=1.0)


def test_records_outlive_the_run_with_their_time_counted_on(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / PAST_JOBS_FILE
    first = PastJobs(path, limit=32, clock_s=lambda: now[0])
    first.load()
    assert first.record(("bert", 1000, 1.0), FAILED)
    assert not first.record(("bert", 1000, 1.0), FAILED)  # once per job
    assert first.record(("gpt3", 1001, 2.0), ENDED)
    assert first.shown(lambda _job: True) == ()  # this run's own jobs are the manager's to show
    assert path.stat().st_mode & 0o777 == 0o600
    os.utime(path, (now[0], now[0]))

    now[0] += 60.0
    second = PastJobs(path, limit=32, clock_s=lambda: now[0])
    second.load()
    shown = second.shown(lambda _job: True)
    assert [(j.job, j.state, j.error) for j in shown] == [
        ("bert", "failed", "solving failed: the frontier is empty"),
        ("gpt3", "ended", ""),
    ]
    assert [j.state_for_s for j in shown] == [65.0, 61.0]
    assert shown[0].plan_energy_j == FAILED.plan_energy_j
    assert [j.job for j in second.shown(lambda job: job.uid == 1001)] == ["gpt3"]  # another user's hidden


def test_only_the_last_records_are_kept(tmp_path: Path) -> None:
    path = tmp_path / PAST_JOBS_FILE
    past = PastJobs(path, limit=3)
    for i in range(5):
        past.record((f"job{i}", 0, float(i)), dataclasses.replace(ENDED, job=f"job{i}"))
    again = PastJobs(path, limit=3)
    again.load()
    assert [j.job for j in again.shown(lambda _job: True)] == ["job2", "job3", "job4"]


def test_an_unreadable_file_is_moved_aside_and_the_history_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / PAST_JOBS_FILE
    path.write_bytes(b'{"v": 6, "id": 0, "type": "jobs", "jobs": [{"job": 3}]}')
    path.chmod(0o600)
    past = PastJobs(path, limit=32)
    past.load()
    assert past.shown(lambda _job: True) == ()
    assert not path.exists()
    assert [p.name.startswith(f"{PAST_JOBS_FILE}.unreadable-") for p in tmp_path.iterdir()] == [True]
    past.record(("bert", 0, 1.0), FAILED)  # and recording goes on
    assert path.exists()

"""Jobs that ended or failed, kept across daemon restarts (`<state_dir>/jobs-ended`).

When a job ends or fails, the daemon records how `perseusctl jobs` showed it at that moment (its `JobInfo`:
state, error, plan, energy); the records of the last `limit` such jobs are written as one `jobs` reply frame
of the wire protocol (so any daemon version reads what another wrote: unknown fields ignored, missing ones
defaulted), durably and privately (`private_file`). A restarted daemon shows the previous runs' records after
its own jobs, their `state_for_s` counted from when they were written. A file that cannot be read is moved
aside (never deleted) and the daemon starts with no history: history never stops a start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from perseus_client.protocol import JobInfo, JobsReply, ProtocolError, decode_reply, encode

from perseusd.private_file import (
    MAX_PRIVATE_BYTES,
    PrivateFileError,
    read_private_file,
    write_private_file,
)

logger = logging.getLogger(__name__)

PAST_JOBS_FILE = "jobs-ended"
WHAT = "the ended jobs' records"


class PastJobs:
    """The records of jobs that ended or failed, this run's and the previous runs' (see module)."""

    def __init__(self, path: Path | None, limit: int, clock_s: Callable[[], float] = time.time) -> None:
        """`path` None: nothing is kept across restarts (records live as long as the process)."""
        self._path, self._limit, self._clock_s = path, limit, clock_s
        self._previous: list[tuple[JobInfo, float]] = []
        """The previous runs' records with the wall time each was written at."""
        self._recorded: list[tuple[JobInfo, float]] = []
        self._keys: set[tuple[str, int, float]] = set()

    def load(self) -> None:
        """Read the previous runs' records (a file that cannot be read is moved aside, logged)."""
        if self._path is None:
            return
        try:
            data = read_private_file(self._path, WHAT)
            if data is None:
                return
            message = decode_reply(data, MAX_PRIVATE_BYTES).message
        except (PrivateFileError, ProtocolError) as exc:
            self._move_aside(str(exc))
            return
        if not isinstance(message, JobsReply):
            self._move_aside(f"a {message.TYPE} frame, not a jobs reply")
            return
        written_s = self._written_at_s()
        self._previous = [(job, written_s) for job in message.jobs][-self._limit :]

    def known(self, key: tuple[str, int, float]) -> bool:
        """Whether the job of `key` was recorded in this run."""
        return key in self._keys

    def record(self, key: tuple[str, int, float], info: JobInfo) -> bool:
        """Keep `info` (a job that ended or failed) once per `key`; written at once. False: known already."""
        if key in self._keys:
            return False
        self._keys.add(key)
        self._recorded.append((info, self._clock_s()))
        self._save()
        return True

    def shown(self, visible: Callable[[JobInfo], bool]) -> tuple[JobInfo, ...]:
        """The previous runs' records `visible` lets through, oldest first, each with its time in its
        state counted up to now."""
        now_s = self._clock_s()
        return tuple(
            dataclasses.replace(job, state_for_s=round(job.state_for_s + max(0.0, now_s - at_s), 3))
            for job, at_s in self._previous
            if visible(job)
        )

    def _save(self) -> None:
        if self._path is None:
            return
        now_s = self._clock_s()
        kept = [*self._previous, *self._recorded][-self._limit :]
        jobs = tuple(
            dataclasses.replace(job, state_for_s=round(job.state_for_s + max(0.0, now_s - at_s), 3))
            for job, at_s in kept
        )
        try:
            write_private_file(self._path, encode(JobsReply(jobs=jobs)), WHAT)
        except PrivateFileError as exc:
            logger.warning("%s (the ended jobs will not be shown after a restart)", exc)

    def _written_at_s(self) -> float:
        assert self._path is not None
        try:
            return os.stat(self._path).st_mtime
        except OSError:
            return self._clock_s()

    def _move_aside(self, why: str) -> None:
        assert self._path is not None
        aside = self._path.with_name(f"{self._path.name}.unreadable-{int(self._clock_s())}")
        try:
            os.replace(self._path, aside)
        except OSError as move_error:
            logger.warning("cannot read %s (%s) nor move it aside (%s)", self._path, why, move_error)
            return
        logger.warning("cannot read %s (%s): moved to %s; no ended jobs from before", self._path, why, aside)

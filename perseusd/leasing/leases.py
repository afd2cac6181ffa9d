"""Client sessions and GPU leases, bound to the caller's uid and process (held through a pidfd).

Pure bookkeeping: no GPU calls and no sockets. The IPC layer polls `pidfds()` with its sockets and reports a
readable pidfd (the process died) to the core, which restores the GPUs that `drop_session` returns.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

from perseusd.errors import (
    GpuBusyError,
    InconsistentStateError,
    LimitReachedError,
    NotLeasedError,
    NotPermittedError,
    NotRegisteredError,
    RefusedError,
)
from perseusd.leasing.identity import (
    Caller,
    DescriptorsExhaustedError,
    checked_start_time,
    out_of_descriptors,
    process_start_time,
    read_start_time,
)
from perseusd.leasing.placement import Placement

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    gpu: str
    pid: int
    uid: int
    start_time: int
    job: str


@dataclass
class Session:
    """One registered client process."""

    caller: Caller
    start_time: int
    pidfd: int
    job: str
    gpus: set[str] = field(default_factory=set)
    events_received: int = 0
    """Events read from this process since it registered (on the event or control socket)."""
    events_dropped: int = 0
    """Of those, the ones rejected (bad frame, not leased, out of order, ...)."""
    dropped_by_code: dict[str, int] = field(default_factory=dict)
    """Those dropped on the event socket, by error code (why: `NOT_LEASED`, `OUT_OF_ORDER`, ...)."""
    ended_sent: int | None = None
    """The `sent` of the client's end marker (`events_end`), once read: `events_received` is final then."""
    lost_counted: int = 0
    """Events of this session counted lost (its end markers' `sent` less what was read)."""
    placement: Placement | None = None
    """Where the process runs (its container, cgroup, devices), read from /proc at its hello."""
    carries: bool = False
    """It said (`carry_ready`) it reads `carry` frames and may send several events a datagram (6.11)."""

    def restart_event_count(self) -> None:
        """Count this session's events from zero (a hello: the client starts its own count there)."""
        self.events_received = self.events_dropped = self.lost_counted = 0
        self.dropped_by_code = {}
        self.ended_sent = None

    @property
    def slurm_job(self) -> int | None:
        """The Slurm job the process runs in (None: none, or not read)."""
        return None if self.placement is None else self.placement.slurm_job


MAX_SESSIONS_PER_USER = 256
MAX_ENDED_SESSIONS = 256
"""Sessions of processes gone, kept for the events still queued from them (read after the process exited,
they count in its session, and its end marker reconciles it); the oldest is forgotten first."""
"""Registered processes per uid (root excepted): each holds a descriptor (pidfd) in the daemon."""


class LeaseBook:
    """Who holds which GPU. All methods run on the daemon's main thread."""

    def __init__(self, max_sessions_per_user: int = MAX_SESSIONS_PER_USER) -> None:
        self._max_sessions_per_user = max_sessions_per_user
        self._per_user: dict[int, int] = {}
        self._sessions: dict[int, Session] = {}
        self._leases: dict[str, Lease] = {}
        self._pidfd_to_pid: dict[int, int] = {}
        self._ended: dict[int, Session] = {}

    # ------------------------------------------------------------------ sessions

    def register(self, caller: Caller, job: str) -> Session:
        """Register (or re-register) the calling process and hold a pidfd for it."""
        session = self._sessions.get(caller.pid)
        if session is not None and session.caller.uid == caller.uid:
            session.caller = caller
            session.job = job
            session.restart_event_count()  # the client counts its events from its hello too
            return session
        if session is not None:
            raise InconsistentStateError(f"process {caller.pid} changed credentials")
        if caller.uid != 0 and self._per_user.get(caller.uid, 0) >= self._max_sessions_per_user:
            raise LimitReachedError(
                f"uid {caller.uid} already has {self._max_sessions_per_user} registered processes "
                "(the per-user limit); close some clients",
            )
        start_time = checked_start_time(caller.pid)
        return self._open_session(caller, start_time, job)

    def adopt(self, caller: Caller, start_time: int, job: str, gpus: set[str]) -> bool:
        """Re-create a session and its leases from the state file (daemon restart); False if it is gone."""
        if process_start_time(caller.pid) != start_time:
            return False
        try:
            session = self._open_session(caller, start_time, job)
        except RefusedError:
            return False
        for gpu in gpus:
            self._add_lease(session, gpu)
        return True

    def _open_session(self, caller: Caller, start_time: int, job: str) -> Session:
        try:
            pidfd = os.pidfd_open(caller.pid)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise out_of_descriptors(exc) from None
            raise NotRegisteredError(f"process {caller.pid}: {exc.strerror}") from None
        try:
            current = read_start_time(caller.pid)
        except DescriptorsExhaustedError as exc:
            os.close(pidfd)
            raise out_of_descriptors(exc) from None
        if current != start_time:  # the pid was reused before we held it
            os.close(pidfd)
            raise NotRegisteredError(f"process {caller.pid} is gone")
        session = Session(caller=caller, start_time=start_time, pidfd=pidfd, job=job)
        self._ended.pop(caller.pid, None)  # a reused pid: the old process's events are not told apart
        self._sessions[caller.pid] = session
        self._pidfd_to_pid[pidfd] = caller.pid
        self._per_user[caller.uid] = self._per_user.get(caller.uid, 0) + 1
        return session

    def session(self, pid: int) -> Session | None:
        return self._sessions.get(pid)

    def require_session(self, caller: Caller) -> Session:
        session = self._sessions.get(caller.pid)
        if session is None or session.caller.uid != caller.uid:
            raise NotRegisteredError("send hello first")
        return session

    def drop_session(self, pid: int) -> list[str]:
        """Forget a process: close its pidfd and drop its leases; returns the GPUs it held."""
        session = self._sessions.pop(pid, None)
        if session is None:
            return []
        self._pidfd_to_pid.pop(session.pidfd, None)
        os.close(session.pidfd)
        left = self._per_user.get(session.caller.uid, 0) - 1
        if left > 0:
            self._per_user[session.caller.uid] = left
        else:
            self._per_user.pop(session.caller.uid, None)
        gpus = sorted(session.gpus)
        for gpu in gpus:
            self._leases.pop(gpu, None)
        if len(self._ended) >= MAX_ENDED_SESSIONS:
            del self._ended[next(iter(self._ended))]
        self._ended[pid] = session
        return gpus

    def count_event(self, pid: int, *, dropped: bool, code: str | None = None) -> None:
        """Count an event read from process `pid` (its session's counters, or those of its session just
        ended: events read after the process exited; nothing without either). `code`: why it was dropped."""
        session = self._sessions.get(pid) or self._ended.get(pid)
        if session is not None:
            session.events_received += 1
            if dropped:
                session.events_dropped += 1
                if code is not None:
                    session.dropped_by_code[code] = session.dropped_by_code.get(code, 0) + 1

    def event_session(self, pid: int) -> Session | None:
        """The session whose events process `pid` sends: its own, or the one it had before it exited."""
        return self._sessions.get(pid) or self._ended.get(pid)

    def holds_lease(self, pid: int) -> bool:
        """Whether process `pid` holds a lease now (the event path's first, cheapest check)."""
        session = self._sessions.get(pid)
        return session is not None and bool(session.gpus)

    def pid_of_pidfd(self, pidfd: int) -> int | None:
        return self._pidfd_to_pid.get(pidfd)

    def pidfds(self) -> tuple[int, ...]:
        return tuple(self._pidfd_to_pid)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------------ leases

    def holder(self, gpu: str) -> Lease | None:
        return self._leases.get(gpu)

    def leases(self) -> dict[str, Lease]:
        return dict(self._leases)

    def check_claim(self, caller: Caller, gpu: str) -> None:
        """Raise unless `caller` may lease `gpu` (free, or already its own)."""
        lease = self._leases.get(gpu)
        if lease is None or lease.pid == caller.pid:
            return
        if lease.uid != caller.uid:
            raise NotPermittedError(f"GPU {gpu} is leased by another user")
        raise GpuBusyError(f"GPU {gpu} is leased by process {lease.pid} ({lease.job})")

    def require_lease(self, caller: Caller, gpu: str) -> Lease:
        """The caller's lease on `gpu`, or a stable error saying why not."""
        lease = self._leases.get(gpu)
        if lease is not None and lease.pid == caller.pid:
            return lease
        if lease is None:
            raise NotLeasedError(f"claim GPU {gpu} first")
        self.check_claim(caller, gpu)
        raise InconsistentStateError("unreachable lease state")

    def claim(self, session: Session, gpu: str) -> Lease:
        self.check_claim(session.caller, gpu)
        return self._add_lease(session, gpu)

    def _add_lease(self, session: Session, gpu: str) -> Lease:
        lease = Lease(gpu, session.caller.pid, session.caller.uid, session.start_time, session.job)
        self._leases[gpu] = lease
        session.gpus.add(gpu)
        return lease

    def release(self, gpu: str) -> Lease | None:
        lease = self._leases.pop(gpu, None)
        if lease is not None:
            session = self._sessions.get(lease.pid)
            if session is not None:
                session.gpus.discard(gpu)
        return lease

    def close(self) -> None:
        for pid in list(self._sessions):
            self.drop_session(pid)

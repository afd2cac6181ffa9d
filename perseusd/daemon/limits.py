"""Descriptor budget: live client connections per user and in all, so that no user can exhaust the daemon's
file descriptors (ZeroMQ and the state file need some too).

Pure bookkeeping: the IPC layer reports each accepted and closed connection (by descriptor, with the peer's
uid from SO_PEERCRED) and shuts down a connection this book refuses. The budget itself comes from the
process's descriptor limit, raised at start (`raise_descriptor_limit`).
"""

from __future__ import annotations

import logging
import resource
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

RESERVED_DESCRIPTORS = 128
"""Descriptors kept for the daemon itself: ZeroMQ's own, GPU devices, /proc, the state file, the journal."""
MAX_CONNECTIONS_PER_USER = 512
"""Connections one uid (root excepted) may hold; a client uses two (control and events)."""
WANTED_NOFILE = 524_288
LOW_NOFILE_WARNING = 4096
_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True)
class ConnectionLimits:
    per_user: int
    total: int
    """Connections plus registered processes (each holds a pidfd) in all."""

    @classmethod
    def for_descriptors(cls, nofile: int) -> ConnectionLimits:
        """The limits under a soft RLIMIT_NOFILE of `nofile`."""
        total = max(16, nofile - RESERVED_DESCRIPTORS)
        return cls(per_user=min(MAX_CONNECTIONS_PER_USER, max(8, total // 2)), total=total)


def raise_descriptor_limit(wanted: int = WANTED_NOFILE) -> int:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (never above the hard limit); returns the soft limit.

    Every client connection and registered process holds a descriptor in the daemon; the usual soft limit
    (1024) runs out with a few hundred clients. The systemd unit sets LimitNOFILE as well.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    if soft < LOW_NOFILE_WARNING:
        logger.warning(
            "descriptor limit is %d: the daemon serves fewer clients (set LimitNOFILE= or ulimit -n)", soft
        )
    return soft


class ConnectionBook:
    """Live connections by descriptor; decides whether a new one may stay."""

    def __init__(self, limits: ConnectionLimits, sessions: Callable[[], int] = lambda: 0) -> None:
        self.limits = limits
        self._sessions = sessions
        self._uid_of_fd: dict[int, int | None] = {}
        self._per_user: dict[int, int] = {}
        self.refused = 0

    @property
    def live(self) -> int:
        return len(self._uid_of_fd)

    def of_user(self, uid: int) -> int:
        return self._per_user.get(uid, 0)

    def accepted(self, fd: int, uid: int | None) -> str | None:
        """Record a new connection; the reason to refuse it (the caller shuts it down), or None."""
        self.closed(fd)  # a descriptor number reused before its close was reported
        if self.live + self._sessions() >= self.limits.total:
            reason = f"the daemon's {self.limits.total} connections and registered processes are in use"
        elif uid is not None and uid != 0 and self.of_user(uid) >= self.limits.per_user:
            reason = f"uid {uid} already holds {self.limits.per_user} connections (the per-user limit)"
        else:
            self._uid_of_fd[fd] = uid
            if uid is not None:
                self._per_user[uid] = self.of_user(uid) + 1
            return None
        self.refused += 1
        return reason

    def closed(self, fd: int) -> None:
        if fd not in self._uid_of_fd:
            return
        uid = self._uid_of_fd.pop(fd)
        if uid is None:
            return
        left = self.of_user(uid) - 1
        if left > 0:
            self._per_user[uid] = left
        else:
            self._per_user.pop(uid, None)


def peer_uid(fd: int) -> int | None:
    """The uid of the peer of a connected unix socket descriptor we do not own (None: not a socket)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        _pid, uid, _gid = _UCRED.unpack(raw)
        return int(uid)
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays ZeroMQ's


def shut_down(fd: int) -> None:
    """End a connection ZeroMQ owns without closing its descriptor: ZeroMQ sees it end and closes it."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()

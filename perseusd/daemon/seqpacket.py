"""The SOCK_SEQPACKET event socket of protocol 6.10 (stdlib only): listen, accept, read datagrams.

One AF_UNIX SOCK_SEQPACKET socket in the runtime directory (`SEQPACKET_EVENT_SOCKET_NAME`, the same mode and
group as the ZeroMQ event socket). A client connects once per session and sends each event frame as one
datagram from its training thread (no I/O thread on either side). The peer's pid, uid and gid are taken by
SO_PEERCRED when the connection is accepted, as the kernel reports them, and every datagram on it is that
peer's: nothing in a frame names its sender. Everything here is non-blocking and bounded per call; the
IPC layer polls the descriptors (`perseusd.daemon.ipc`) and decides what a datagram means
(`perseusd.daemon.event_intake`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from perseusd.daemon.limits import ConnectionBook
from perseusd.daemon.runtime_dir import SOCKET_MODE, reclaim_stale_socket, set_group
from perseusd.leasing.identity import Caller

MAX_DATAGRAM_BYTES = 64 * 1024
"""The largest datagram read (an event frame is about 200 bytes, the end marker less); a longer one is read
truncated and refused as oversized."""
ACCEPT_BATCH = 64
"""Connections accepted per wake-up before the loop serves the rest."""
LISTEN_BACKLOG = 128
_UCRED = struct.Struct("3i")  # pid, uid, gid
_RECV_FLAGS = socket.MSG_DONTWAIT | socket.MSG_TRUNC  # MSG_TRUNC: the datagram's whole length is returned
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_GONE = frozenset((errno.ECONNRESET, errno.ENOTCONN, errno.EPIPE, errno.EBADF))
CLOSED = -1
"""`Connection.read`'s answer when the peer closed (or reset) its connection."""
EMPTY = -2
"""`Connection.read`'s answer when no datagram waits."""
_NOTHING_QUEUED = bytes(4)
"""FIONREAD's answer (a C int) when no datagram waits: on a SOCK_SEQPACKET socket it gives the length of
the next datagram, so a zero-length one (which reads as a close) also answers it; the poll then fires again
and the read that follows it finds the close."""


@dataclass
class Connection:
    """One client's connection: the socket and the peer the kernel named at accept."""

    sock: socket.socket
    caller: Caller

    def read(self, buffer: bytearray) -> int:
        """Read one datagram into `buffer`: its whole length (more than `len(buffer)`: it was truncated),
        EMPTY when none waits, CLOSED when the peer is gone (a zero-length datagram reads as a close)."""
        try:
            length = self.sock.recv_into(buffer, 0, _RECV_FLAGS)
        except (BlockingIOError, InterruptedError):
            return EMPTY
        except OSError as exc:
            if exc.errno in _GONE:
                return CLOSED
            raise
        return length if length > 0 else CLOSED

    def waiting(self, scratch: bytearray) -> bool:
        """Whether a datagram of some length waits (one ioctl: asking costs a tenth of the `BlockingIOError`
        a read of an empty queue raises, which each wake-up of the event path otherwise ended with); a
        failed ask answers True, and the read that follows says what happened."""
        try:
            fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, scratch, True)
        except OSError:
            return True
        return scratch != _NOTHING_QUEUED


class SeqpacketListener:
    """The listening socket; `accept` yields each new connection with its peer's credentials."""

    def __init__(self, path: Path, gid: int | None) -> None:
        self.path = path
        reclaim_stale_socket(path, socket.SOCK_SEQPACKET)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            old_umask = os.umask(0o117)
            try:
                sock.bind(str(path))
            finally:
                os.umask(old_umask)
            os.chmod(path, SOCKET_MODE)
            set_group(path, gid)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self) -> list[Connection]:
        """The connections waiting, at most ACCEPT_BATCH (each non-blocking, with its SO_PEERCRED)."""
        accepted: list[Connection] = []
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except (
                OSError
            ) as exc:  # a peer that gave up, or out of descriptors: the rest wait for the next wake
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                break
            sock.setblocking(False)
            try:
                raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            except OSError:
                sock.close()
                continue
            pid, uid, gid = _UCRED.unpack(raw)
            accepted.append(Connection(sock, Caller(uid=uid, gid=gid, pid=pid)))
        return accepted

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)


class FdPoller(Protocol):
    def add_fd(self, fd: int) -> None: ...
    def remove_fd(self, fd: int) -> None: ...


@dataclass(frozen=True)
class SeqpacketHandlers:
    """What the IPC layer does with what this socket brings."""

    may_connect: Callable[[Caller], bool]
    """Whether this peer may send events (the event socket's access rule); refused: closed at accept."""
    frame: Callable[[Caller, bytes], int | None]
    """One datagram of a peer, whole (never raises): how many event frames it held (None: one)."""
    oversized: Callable[[Caller, int], None]
    """A datagram longer than the largest read (its length): counted and dropped."""
    requests_waiting: Callable[[], bool]
    """Asked every `check_every` datagrams: a waiting request ends the batch."""
    warn: Callable[[str, str], None]
    """A rate-limited warning (key, message)."""


class SeqpacketEvents:
    """The listener and its connections: accepted within the limits of the daemon's `ConnectionBook`, read
    non-blocking a bounded batch at a time, closed and forgotten when the peer closes."""

    def __init__(
        self,
        listener: SeqpacketListener,
        book: ConnectionBook,
        poller: FdPoller,
        handlers: SeqpacketHandlers,
        *,
        batch: int,
        check_every: int,
        max_datagram_bytes: int = MAX_DATAGRAM_BYTES,
    ) -> None:
        self._listener = listener
        self._book = book
        self._poller = poller
        self._handlers = handlers
        self._batch = batch
        self._check_every = check_every
        self._buffer = bytearray(max_datagram_bytes)
        self._view = memoryview(self._buffer)
        self._queued = bytearray(4)
        self.connections: dict[int, Connection] = {}
        self.listen_fd = listener.fileno()
        self._fds = {self.listen_fd}
        """The listener's descriptor and every connection's."""
        poller.add_fd(self.listen_fd)

    def owns(self, fds: set[int]) -> bool:
        """Whether every descriptor of `fds` is the listener's or a connection's."""
        return fds <= self._fds

    def serve(self, fds: set[int]) -> None:
        """Accept on the listener and read each ready connection (those of `fds`)."""
        if self.listen_fd in fds:
            self._accept()
        connections = self.connections
        for fd in fds:
            connection = connections.get(fd)
            if connection is not None:
                self._read(fd, connection)

    def _accept(self) -> None:
        handlers = self._handlers
        for connection in self._listener.accept():
            fd, caller = connection.sock.fileno(), connection.caller
            if not handlers.may_connect(caller):
                connection.sock.close()
                handlers.warn("seq-refused", f"refused an event connection from {caller} (not allowed)")
                continue
            reason = self._book.accepted(fd, caller.uid)
            if reason is not None:
                connection.sock.close()
                handlers.warn("conn-limit", f"refused an event connection (uid {caller.uid}): {reason}")
                continue
            self.connections[fd] = connection
            self._fds.add(fd)
            self._poller.add_fd(fd)

    def send_to(self, pid: int, data: bytes) -> int:
        """Send one datagram on each connection of process `pid` without waiting: on how many it was queued
        (a full or closed one is passed over: what is told there is only an allowance)."""
        sent = 0
        for connection in list(self.connections.values()):
            if connection.caller.pid != pid:
                continue
            try:
                connection.sock.send(data, _SEND_FLAGS)
                sent += 1
            except OSError:
                pass
        return sent

    def _read(self, fd: int, connection: Connection) -> None:
        """Datagrams until `batch` event frames were read (a datagram of carried events holds several); a
        waiting request, asked every `check_every` frames, ends the batch early (the poll fires again). The
        first is read at once (the poll said one waits); before each other the queue is asked, so that a
        wake-up for one event ends without a read that fails."""
        handlers, caller, buffer, view = self._handlers, connection.caller, self._buffer, self._view
        size, queued = len(buffer), self._queued
        frames = checked = 0
        while frames < self._batch:
            if frames:
                if not connection.waiting(queued):
                    return
                if frames - checked >= self._check_every:
                    checked = frames
                    if handlers.requests_waiting():
                        return
            try:
                length = connection.read(buffer)
            except OSError as exc:
                handlers.warn("seq-read", f"event connection of process {caller.pid} failed: {exc}")
                length = CLOSED
            if length == EMPTY:
                return
            if length == CLOSED:
                self._close(fd)
                return
            if length > size:
                handlers.oversized(caller, length)
                frames += 1
            else:
                frames += handlers.frame(caller, bytes(view[:length])) or 1

    def _close(self, fd: int) -> None:
        connection = self.connections.pop(fd, None)
        if connection is None:
            return
        self._fds.discard(fd)
        self._poller.remove_fd(fd)
        self._book.closed(fd)
        connection.sock.close()

    def close(self) -> None:
        for fd in list(self.connections):
            self._close(fd)
        self._poller.remove_fd(self.listen_fd)
        self._listener.close()

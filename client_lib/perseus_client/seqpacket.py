"""The client's SOCK_SEQPACKET event connection (protocol 6.10; stdlib only).

Each event frame is one datagram, sent with a non-blocking send(2) from the thread that calls the event
method: no queue, no I/O thread. A full socket buffer (EAGAIN, ENOBUFS) drops the event, counted by the
client; a connection the daemon closed (EPIPE, ECONNRESET) is marked broken and the client stops using it.
Nothing here blocks or raises into training.

The socket is opened at a fixed name in the client's own runtime directory, never at a path the daemon names:
the daemon only says that it serves it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import termios

from perseus_client.envelope import SEQPACKET_EVENT_SOCKET_NAME

logger = logging.getLogger(__name__)

SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
SNDBUF_BYTES = 1024 * 1024
"""The most the kernel may queue towards the daemon (SO_SNDBUF; each event datagram takes about 1.3 KiB of it
with the kernel's overhead). The kernel caps it at twice `net.core.wmem_max`: by default 416 KiB, about 330
events; at this size about 820. A daemon that reads slower than a client sends makes the client drop, and
count, the rest."""
_FULL = frozenset((errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR))
MAX_PUSHED_BYTES = 1 << 20
"""The largest frame the daemon sends on this connection that is read (a `carry` frame: about 80 bytes a
computation of the plan); a longer one is read truncated and ignored."""


class EventSocket:
    """A connected, non-blocking SOCK_SEQPACKET socket to the daemon's event socket."""

    __slots__ = ("_queued", "_sock", "broken")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._queued = bytearray(4)  # FIONREAD's answer, a C int
        self.broken = False
        """The daemon closed the connection (or it failed otherwise): nothing sent on it is read any more."""

    def send(self, data: bytes) -> bool:
        """Send one datagram without waiting; whether it was queued (False: full, or broken)."""
        try:
            self._sock.send(data, SEND_FLAGS)
        except OSError as exc:
            if exc.errno not in _FULL:
                self.broken = True
            return False
        return True

    def receive(self) -> bytes | None:
        """The next datagram the daemon sent on this connection, None when none waits (never waits; asks the
        queue first, so an empty one costs an ioctl instead of a failed read and its exception)."""
        if self.broken:
            return None
        try:
            fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, self._queued, True)
            size = int.from_bytes(self._queued, "little")
            if size == 0:
                return None
            return self._sock.recv(min(size, MAX_PUSHED_BYTES), socket.MSG_DONTWAIT)
        except OSError:
            return None

    def close(self) -> None:
        self.broken = True
        self._sock.close()


def connect(runtime_dir: os.PathLike[str] | str, advertised: str) -> EventSocket | None:
    """Connect to the daemon's SOCK_SEQPACKET event socket in `runtime_dir`; None (events go to ZeroMQ's
    socket) when the daemon advertised another name or the socket cannot be opened."""
    if advertised != SEQPACKET_EVENT_SOCKET_NAME:
        logger.debug(
            "perseus: the daemon's event socket %r is not %r: events over ZeroMQ",
            advertised,
            SEQPACKET_EVENT_SOCKET_NAME,
        )
        return None
    path = os.path.join(os.fspath(runtime_dir), SEQPACKET_EVENT_SOCKET_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES // 2)  # the kernel doubles it
        sock.setblocking(False)
        sock.connect(path)  # never waits: a daemon whose backlog is full answers EAGAIN
    except OSError as exc:
        sock.close()
        logger.info("perseus: cannot open the event socket %s (%s): events over ZeroMQ", path, exc)
        return None
    return EventSocket(sock)

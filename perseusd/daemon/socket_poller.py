"""One poll(2) over ZeroMQ sockets and plain descriptors: the IPC layer's wait (`perseusd.daemon.ipc`).

Part of the IPC layer, the only modules that import zmq. The server registers its sockets and descriptors
here and tells the poller which sockets it used; `readable` is the one cheap question asked of a socket.
"""

from __future__ import annotations

import select
import time

import zmq

_POLLIN = int(zmq.POLLIN)  # a plain int: `&` with the enum member costs an enum operation per event


class SocketPoller:
    """Waits on ZeroMQ sockets and plain descriptors with one poll(2) per wake-up.

    `zmq_poll` asks every ZeroMQ socket for its state (ZMQ_EVENTS: a poll of the socket's mailbox and a
    getpid) before and after it waits: with the daemon's seven sockets, about 17 poll(2) and 17 getpid calls
    for each event a training process sends. Here the kernel polls each socket's ZMQ_FD with the plain
    descriptors, and a socket is asked for its state only when its descriptor fired or when the loop used it
    since it was last asked: ZMQ_FD is edge-triggered, so an operation on a socket (a read, a send, asking its
    state) may take the edge of a message that arrived meanwhile, and such a socket is asked before the next
    wait.
    """

    def __init__(self) -> None:
        self._poll = select.poll()
        self._sockets_by_fd: dict[int, zmq.Socket[bytes]] = {}
        self._to_ask: set[zmq.Socket[bytes]] = set()

    def add_socket(self, sock: zmq.Socket[bytes]) -> None:
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._sockets_by_fd[fd] = sock
        self._poll.register(fd, select.POLLIN)
        self._to_ask.add(sock)

    def add_fd(self, fd: int) -> None:
        self._poll.register(fd, select.POLLIN)

    def remove_fd(self, fd: int) -> None:
        self._poll.unregister(fd)

    def used(self, *socks: zmq.Socket[bytes]) -> None:
        """The loop read from, wrote to or asked these sockets: ask them before the next wait."""
        self._to_ask.update(socks)

    def used_all(self) -> None:
        self._to_ask.update(self._sockets_by_fd.values())

    def poll(self, timeout_ms: int) -> tuple[list[zmq.Socket[bytes]], set[int]]:
        """Wait up to `timeout_ms` (negative: no limit) for a message on a socket or a readable (or failed)
        descriptor; the sockets with a message waiting and the descriptors, both empty after a timeout."""
        deadline_s = time.monotonic() + timeout_ms / 1e3
        sockets_by_fd = self._sockets_by_fd
        while True:
            to_ask = self._to_ask
            ready = [sock for sock in to_ask if readable(sock)] if to_ask else []
            to_ask.clear()
            fired = self._poll.poll(0 if ready else timeout_ms)
            fds: set[int] = set()
            for fd, _events in fired:
                sock = sockets_by_fd.get(fd)
                if sock is None:
                    fds.add(fd)
                elif sock not in ready and readable(sock):
                    ready.append(sock)
            if ready or fds or not fired or timeout_ms == 0:
                return ready, fds
            if timeout_ms > 0:  # only a socket's own bookkeeping woke it: wait for the rest
                timeout_ms = max(0, round((deadline_s - time.monotonic()) * 1e3))


def readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits on `sock` (one getsockopt: no exception as `zmq.Again` raises)."""
    flags = sock.getsockopt(zmq.EVENTS)
    return isinstance(flags, int) and bool(flags & _POLLIN)

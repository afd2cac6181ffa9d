"""How the SOCK_SEQPACKET event socket reads a connection's datagrams (`perseusd.daemon.seqpacket`), on real
sockets: a wake-up reads every datagram queued, in order, and one for a single event ends without a read
that fails (the queue is asked first); a close, or a zero-length datagram, queued behind datagrams is found
by the next wake-up, as the poll fires again."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.daemon import seqpacket
from perseusd.daemon.limits import ConnectionBook, ConnectionLimits
from perseusd.daemon.seqpacket import SeqpacketEvents, SeqpacketHandlers, SeqpacketListener
from perseusd.leasing.identity import Caller

pytestmark = pytest.mark.timeout(30)


class Poller:
    def __init__(self) -> None:
        self.fds: set[int] = set()

    def add_fd(self, fd: int) -> None:
        self.fds.add(fd)

    def remove_fd(self, fd: int) -> None:
        self.fds.discard(fd)


class Served:
    """The events and a connection: what the handlers were given, and the client's socket."""

    def __init__(self, tmp_path: Path) -> None:
        self.frames: list[bytes] = []
        self.poller = Poller()
        handlers = SeqpacketHandlers(
            may_connect=lambda _caller: True,
            frame=lambda _caller, data: self.frames.append(data),
            oversized=lambda _caller, _length: None,
            requests_waiting=lambda: False,
            warn=lambda _key, _message: None,
        )
        listener = SeqpacketListener(tmp_path / "events.sock", None)
        book = ConnectionBook(ConnectionLimits(per_user=8, total=16))
        self.events = SeqpacketEvents(listener, book, self.poller, handlers, batch=128, check_every=16)
        self.client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.client.connect(str(tmp_path / "events.sock"))
        self.events.serve({self.events.listen_fd})
        (self.fd,) = self.events.connections

    def wake(self) -> None:
        """What the loop does when the poll says the connection is readable."""
        self.events.serve({self.fd})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    built = Served(tmp_path)
    yield built
    built.client.close()
    built.events.close()


@pytest.fixture
def empty_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reads that found no datagram (each one a `BlockingIOError` raised and caught)."""
    empty: list[int] = []
    read = seqpacket.Connection.read

    def counted(self: seqpacket.Connection, buffer: bytearray) -> int:
        length = read(self, buffer)
        if length == seqpacket.EMPTY:
            empty.append(length)
        return length

    monkeypatch.setattr(seqpacket.Connection, "read", counted)
    return empty


def test_a_wake_up_for_one_event_reads_it_and_no_more(served: Served, empty_reads: list[int]) -> None:
    for number in range(3):
        served.client.send(b"event %d" % number)
        served.wake()
    assert served.frames == [b"event 0", b"event 1", b"event 2"]
    assert empty_reads == []


def test_a_wake_up_reads_every_datagram_queued_in_order(served: Served, empty_reads: list[int]) -> None:
    sent = [b"x" * length for length in (1, 200, 3, 4096)]
    for data in sent:
        served.client.send(data)
    served.wake()
    assert served.frames == sent
    assert empty_reads == []


def test_a_close_queued_behind_datagrams_is_found_by_the_next_wake_up(served: Served) -> None:
    served.client.send(b"last event")
    served.client.close()
    served.wake()
    assert served.frames == [b"last event"]
    if served.events.connections:  # read in the same wake-up or the next: the poll fires while it waits
        served.wake()
    assert served.events.connections == {}
    assert served.fd not in served.poller.fds
    assert not served.events.owns({served.fd})


def test_a_zero_length_datagram_behind_others_still_reads_as_a_close(served: Served) -> None:
    served.client.send(b"event")
    served.client.send(b"")
    served.wake()
    assert served.frames == [b"event"]
    served.wake()
    assert served.events.connections == {}
    assert served.frames == [b"event"]


def test_the_listener_and_connections_are_what_it_owns(served: Served) -> None:
    assert served.events.owns({served.events.listen_fd, served.fd})
    assert not served.events.owns({served.fd, max(served.poller.fds) + 100})


def test_whether_a_datagram_waits_is_asked_without_reading_it(served: Served) -> None:
    (connection,) = served.events.connections.values()
    scratch = bytearray(4)
    assert not connection.waiting(scratch)
    served.client.send(b"queued")
    assert connection.waiting(scratch)
    assert connection.waiting(scratch)  # asking leaves it queued
    served.wake()
    assert served.frames == [b"queued"]
    assert not connection.waiting(scratch)


def test_the_peer_is_named_by_the_kernel(served: Served) -> None:
    (connection,) = served.events.connections.values()
    assert connection.caller == Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())


def test_a_wake_up_counts_frames_not_datagrams(tmp_path: Path) -> None:
    """Datagrams of carried events hold several frames: a wake-up reads `batch` frames, not datagrams, and
    asks for a waiting request every `check_every` frames, so a request waits no longer behind them."""
    seen: list[bytes] = []
    asked: list[int] = []
    waiting = [False]
    handlers = SeqpacketHandlers(
        may_connect=lambda _caller: True,
        frame=lambda _caller, data: seen.append(data) or len(data.split(b"\n")),
        oversized=lambda _caller, _length: None,
        requests_waiting=lambda: asked.append(len(seen)) or waiting[0],
        warn=lambda _key, _message: None,
    )
    listener = SeqpacketListener(tmp_path / "events.sock", None)
    book = ConnectionBook(ConnectionLimits(per_user=8, total=16))
    events = SeqpacketEvents(listener, book, Poller(), handlers, batch=40, check_every=16)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        client.connect(str(tmp_path / "events.sock"))
        events.serve({events.listen_fd})
        (fd,) = events.connections
        for _ in range(9):
            client.send(b"\n".join([b"f"] * 10))  # ten frames a datagram
        events.serve({fd})
        assert (len(seen), asked) == (4, [2])  # 40 frames; asked once, after 20
        waiting[0] = True
        events.serve({fd})
        assert (len(seen), asked) == (6, [2, 6])  # a request waits: the batch ends at the first ask
        waiting[0] = False
        events.serve({fd})
        assert len(seen) == 9
    finally:
        client.close()
        events.close()

"""The SOCK_SEQPACKET event socket of protocol 6.10 against real daemon processes and real sockets.

Events on a connection are the connecting process's, as the kernel named it at accept (SO_PEERCRED): another
process cannot send for a GPU it does not hold. Malformed and oversized datagrams are counted and the daemon
serves on; connections over the per-user budget are closed; a peer that closes is forgotten. Every
assertion is on counts the daemon reports once it has read what was sent (waits are bounded, never timed).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from perseus_client import PerseusClient
from perseus_client.event_frames import EventWriter
from perseus_client.protocol import PROTOCOL_MINOR, SEQPACKET_EVENT_SOCKET_NAME, EventsEnd, encode

from perseusd.daemon.limits import MAX_CONNECTIONS_PER_USER
from tests.support.frames import assert_serves_and_nothing_locked
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes, flood_as_nobody

pytestmark = pytest.mark.timeout(120)

WAIT_S = 60.0
IMPOSTOR = r"""
import socket, sys
from perseus_client.event_frames import EventWriter

path, gpu, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
frames = EventWriter()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.connect(path)
for microbatch in range(count):
    sock.send(frames.computation(b"comp_begin", gpu, 0, "forward", microbatch, 0, 1))
sock.close()
"""


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=2, env={"PERSEUSD_SOCKET_GROUP": "nogroup"}).start()


def _health(daemon: DaemonProcess) -> dict[str, Any]:
    health: dict[str, Any] = daemon.status()["daemon"]
    return health


def _until(daemon: DaemonProcess, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    deadline_s = time.monotonic() + WAIT_S
    while not check(health := _health(daemon)):
        assert time.monotonic() < deadline_s, f"waiting for {what}: {health}"
        time.sleep(0.05)
    return health


def _connect(daemon: DaemonProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(daemon.dirs.runtime_dir / SEQPACKET_EVENT_SOCKET_NAME))
    return sock


def _code(health: dict[str, Any], code: str) -> int:
    return int(health["errors_by_code"].get(code, 0))


def test_the_socket_is_served_beside_the_others_with_their_mode(daemon: DaemonProcess) -> None:
    path = daemon.dirs.runtime_dir / SEQPACKET_EVENT_SOCKET_NAME
    control = daemon.dirs.runtime_dir / "control.sock"
    assert path.is_socket()
    assert (path.stat().st_mode & 0o777, path.stat().st_gid) == (
        control.stat().st_mode & 0o777,
        control.stat().st_gid,
    )
    with PerseusClient(daemon.dirs.runtime_dir, job="seq", timeout_s=10, strict=True) as client:
        assert client.daemon_info is not None
        assert client.daemon_info.event_socket == SEQPACKET_EVENT_SOCKET_NAME
        assert client.event_transport == "seqpacket"
    daemon.stop()
    assert not path.exists()  # removed at exit like the others


def test_events_on_a_connection_are_its_peers_never_another_process(daemon: DaemonProcess) -> None:
    """Another process sends computations of a GPU this process holds: the daemon counts them as that
    process's (it holds no lease: NOT_LEASED), and this process's session reads none of them."""
    with PerseusClient(daemon.dirs.runtime_dir, job="owner", timeout_s=10, strict=True) as client:
        assert client.daemon_info is not None
        gpu = client.daemon_info.gpus[0].uuid
        client.claim([gpu])
        with client.computation(gpu, 0, "forward", 0):
            pass
        assert client.event_transport == "seqpacket"
        _until(daemon, lambda h: h["events_received"] == 2, "the owner's two events")
        path = str(daemon.dirs.runtime_dir / SEQPACKET_EVENT_SOCKET_NAME)
        subprocess.run([sys.executable, "-c", IMPOSTOR, path, gpu, "50"], check=True, timeout=60)
        health = _until(daemon, lambda h: h["events_received"] == 52, "the impostor's events")
        assert _code(health, "NOT_LEASED") == 50
        assert client.event_count().received == 2  # none of them counted for the GPU's holder
        assert _code(health, "OUT_OF_ORDER") == 0  # nor applied to its open computations
    daemon.stop()
    assert "events dropped unread: process" in daemon.log()


def test_malformed_and_oversized_datagrams_are_counted_and_the_connection_serves_on(
    daemon: DaemonProcess,
) -> None:
    with PerseusClient(daemon.dirs.runtime_dir, job="bad", timeout_s=10, strict=True) as client:
        assert client.daemon_info is not None
        gpu = client.daemon_info.gpus[0].uuid
        client.claim([gpu])
        frames = EventWriter()
        with _connect(daemon) as sock:  # this process's own second connection: the same peer
            for bad in (b"not json", b'{"v":6,"id":0,"type":"comp_begin"}', b"{" * 5000):
                sock.send(bad)
            sock.send(b"x" * (100 * 1024))  # longer than any event frame
            for microbatch in range(10):
                sock.send(frames.computation(b"comp_begin", gpu, 0, "forward", microbatch, 0, 1))
                sock.send(frames.computation(b"comp_end", gpu, 0, "forward", microbatch, 0, 2))
            health = _until(daemon, lambda h: h["events_received"] == 24, "every datagram read")
            assert _code(health, "TOO_LARGE") == 1
            assert health["events_dropped"] == 4  # the three malformed and the oversized one
            assert client.event_count().received == 24
            sock.send(frames.step(b"step_begin", gpu, 0, 3))  # the same connection still serves
            _until(daemon, lambda h: h["events_received"] == 25, "a datagram after the bad ones")
    daemon.stop()
    assert "event datagram of 102400 bytes" in daemon.log()


def test_a_peer_that_closes_is_forgotten(daemon: DaemonProcess) -> None:
    before = _health(daemon)["connections"]
    socks = [_connect(daemon) for _ in range(20)]
    _until(daemon, lambda h: h["connections"] >= before + 20, "20 connections accepted")
    for sock in socks:
        sock.close()
    _until(daemon, lambda h: h["connections"] <= before, "the closed connections forgotten")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody needs root")
def test_connections_over_the_per_user_budget_are_closed(daemon: DaemonProcess) -> None:
    flood = MAX_CONNECTIONS_PER_USER + 40
    path = str(daemon.dirs.runtime_dir / SEQPACKET_EVENT_SOCKET_NAME)
    pid, read_fd = flood_as_nobody(path, flood, socket.SOCK_SEQPACKET)
    try:
        with os.fdopen(read_fd) as ready:
            assert int(ready.readline()) == flood  # all connected (the listen backlog); then judged
        health = _until(daemon, lambda h: h["connections_refused"] >= 40, "the connections over budget")
        assert health["connections_refused"] == 40
        assert health["connections"] <= MAX_CONNECTIONS_PER_USER + 8  # the flood's budget, and root's own
        assert_serves_and_nothing_locked(daemon.dirs.runtime_dir, state_dir=daemon.dirs.state_dir)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    _until(daemon, lambda h: h["connections"] < 8, "the flood's connections closed")
    assert "refused an event connection (uid 65534)" in daemon.log()


def test_the_marker_closes_the_stream_in_order_and_later_events_still_count(daemon: DaemonProcess) -> None:
    """On one connection the marker is read after every datagram before it; events after it are read and
    counted as on ZeroMQ's socket (received, and in the session's figures at a later marker)."""
    with PerseusClient(daemon.dirs.runtime_dir, job="order", timeout_s=10, strict=True) as client:
        assert client.daemon_info is not None
        gpu = client.daemon_info.gpus[0].uuid
        client.claim([gpu])
        frames = EventWriter()
        with _connect(daemon) as sock:
            for microbatch in range(100):
                sock.send(frames.computation(b"comp_begin", gpu, 0, "forward", microbatch, 0, 1))
            sock.send(encode(EventsEnd(sent=100, dropped=0), minor=PROTOCOL_MINOR))
            for microbatch in range(100, 103):
                sock.send(frames.computation(b"comp_begin", gpu, 0, "forward", microbatch, 0, 1))
            health = _until(daemon, lambda h: h["events_received"] == 103, "every datagram read")
        assert health["events_lost"] == 0
        count = client.event_count()
        assert (count.received, count.ended_sent) == (103, 100)
    daemon.stop()
    assert "sent 100, read 100 (used 100, dropped 0), lost in transit 0" in daemon.log()

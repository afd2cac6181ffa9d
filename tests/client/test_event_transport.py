"""Which socket events travel on, against real daemon processes: the SOCK_SEQPACKET socket between a client
and a daemon of protocol 6.10, ZeroMQ's event socket when either side is older; a full socket drops and
counts, a killed daemon's connection is given up and a restarted daemon's is opened again. Every count is
compared once the daemon has read the end marker (exact, whatever the machine's speed).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest
from perseus_client import PerseusClient
from perseus_client.protocol import SEQPACKET_EVENT_SOCKET_NAME

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(120)
# Runs on every Python the client supports (scripts/test_client_pythons.sh): the client library, pytest and
# pyzmq only.

TALLY = re.compile(r"events of process \d+ \(job '([^']*)'\): sent (\d+), read (\d+)")


@pytest.fixture
def make() -> Iterator[Callable[..., DaemonProcess]]:
    with daemon_processes() as factory:
        yield factory


def _send(client: PerseusClient, gpu: str, microbatches: int) -> None:
    for microbatch in range(microbatches):
        client.computation_begin(gpu, 0, "forward", microbatch)
        client.computation_end(gpu, 0, "forward", microbatch)


def _claimed(client: PerseusClient) -> str:
    assert client.daemon_info is not None
    gpu = client.daemon_info.gpus[0].uuid
    assert client.claim([gpu]) == (gpu,)
    return gpu


def _tally(daemon: DaemonProcess, job: str) -> tuple[int, int]:
    """The daemon's (sent, read) of `job`'s session at its end marker."""
    found = [(int(sent), int(read)) for name, sent, read in TALLY.findall(daemon.log()) if name == job]
    assert len(found) == 1, daemon.log()
    return found[0]


def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline_s, f"timed out waiting for {what}"
        time.sleep(0.02)


def _a_6_9_session_on_zeromq(daemon: DaemonProcess, job: str) -> None:
    """A session that speaks 6.9 sends its 200 events and its end marker on ZeroMQ's socket, all read."""
    with PerseusClient(daemon.dirs.runtime_dir, job=job, timeout_s=10, strict=True) as client:
        assert client.protocol_minor == 9
        assert client.daemon_info is not None
        assert client.daemon_info.event_socket is None
        assert client.event_transport == "zmq"
        _send(client, _claimed(client), 100)
    assert (client.events_sent, client.events_lost) == (200, 0)
    daemon.stop()
    assert _tally(daemon, job) == (200, 200)  # the 6.9 marker, on ZeroMQ's socket


def test_new_client_and_new_daemon_use_the_seqpacket_socket(make: Callable[..., DaemonProcess]) -> None:
    daemon = make(DaemonDirs.create(), gpus=1).start()
    with PerseusClient(daemon.dirs.runtime_dir, job="new", timeout_s=10, strict=True) as client:
        assert client.event_transport == "seqpacket"
        _send(client, _claimed(client), 100)
    assert (client.events_sent, client.events_dropped, client.events_lost) == (200, 0, 0)
    daemon.stop()
    assert _tally(daemon, "new") == (200, 200)


def test_new_client_and_a_daemon_of_6_9_use_zeromq(make: Callable[..., DaemonProcess]) -> None:
    daemon = make(DaemonDirs.create(), gpus=1, env={"PERSEUSD_PROTOCOL_MINOR": "9"}).start()
    assert not (daemon.dirs.runtime_dir / SEQPACKET_EVENT_SOCKET_NAME).exists()
    _a_6_9_session_on_zeromq(daemon, "to-old")


def test_a_client_of_6_9_and_a_new_daemon_use_zeromq(
    make: Callable[..., DaemonProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client of 6.9 says hello in 6.9: the reply leaves `event_socket` out, so events go on ZeroMQ."""
    monkeypatch.setattr("perseus_client.connection.PROTOCOL_MINOR", 9)
    daemon = make(DaemonDirs.create(), gpus=1).start()
    _a_6_9_session_on_zeromq(daemon, "old")


def test_a_daemon_told_not_to_serve_it_uses_zeromq(make: Callable[..., DaemonProcess]) -> None:
    daemon = make(DaemonDirs.create(), gpus=1, env={"PERSEUSD_SEQPACKET_EVENTS": "false"}).start()
    with PerseusClient(daemon.dirs.runtime_dir, job="off", timeout_s=10, strict=True) as client:
        assert client.event_transport == "zmq"


def test_a_full_socket_drops_and_counts_and_never_blocks(make: Callable[..., DaemonProcess]) -> None:
    """The daemon stopped (SIGSTOP) reads nothing: the kernel's buffer fills, the rest are dropped and
    counted; once it runs again, the marker closes the figures exactly on both sides."""
    daemon = make(DaemonDirs.create(), gpus=1).start()
    with PerseusClient(daemon.dirs.runtime_dir, job="full", timeout_s=10, strict=True) as client:
        gpu = _claimed(client)
        assert client.event_transport == "seqpacket"
        daemon.signal(signal.SIGSTOP)
        try:
            _send(client, gpu, 5000)
        finally:
            daemon.signal(signal.SIGCONT)
        assert client.events_sent + client.events_dropped == 10000
        assert client.events_dropped > 0  # no kernel buffers 10,000 datagrams
        assert client.event_transport == "seqpacket"  # a full socket is not a broken one
    assert client.events_lost == 0
    daemon.stop()
    assert _tally(daemon, "full") == (client.events_sent, client.events_sent)


def test_a_killed_and_restarted_daemon_gets_a_new_seqpacket_connection(
    make: Callable[..., DaemonProcess],
) -> None:
    dirs = DaemonDirs.create()
    first = make(dirs, gpus=1).start()
    with PerseusClient(dirs.runtime_dir, job="again", timeout_s=2.0) as client:
        gpu = _claimed(client)
        _send(client, gpu, 50)
        assert client.event_transport == "seqpacket"
        first.signal(signal.SIGKILL)
        first.wait()
        _eventually(lambda: not client.managed, "the client to notice")
        dropped = client.events_dropped
        _send(client, gpu, 50)  # fail-open: dropped and counted, never raised
        assert client.events_dropped - dropped == 100
        second = make(dirs, gpus=1).start()
        _eventually(lambda: client.reconnects == 1, "the client to reconnect")
        assert client.event_transport == "seqpacket"
        sent = client.events_sent
        _send(client, gpu, 100)
        assert client.events_sent - sent == 200
    assert client.events_lost == 0
    second.stop()
    assert _tally(second, "again") == (200, 200)  # the second session: its events only

"""perseusctl's link to the daemon when the other end is not a working daemon: each case is one clear error
(`DaemonUnreachableError`, exit 2, or `DaemonRequestError` for a reply that is not one), never a hang or a
traceback. (Against real daemons it runs in every `perseusctl` test; a refusal by the daemon's handshake in
tests/daemon/test_e2e_security.py.)"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perseus_client.status_messages import StatusReply, StatusRequest

from perseusd.ctl.daemon_link import MAX_REPLY_BYTES, DaemonRequestError, DaemonUnreachableError, ask
from perseusd.errors import PerseusError
from tests.support.stub_daemon import Answer, StubDaemon

pytestmark = pytest.mark.timeout(30)


@contextlib.contextmanager
def _listener(path: Path, serve: Callable[[socket.socket], None]) -> Iterator[None]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            serve(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.close()
        thread.join(timeout=5)


def _error(runtime_dir: Path) -> str:
    with pytest.raises(DaemonUnreachableError) as info:
        ask(runtime_dir, StatusRequest(), StatusReply, admin=False, timeout_s=0.5)
    return str(info.value)


def test_a_stale_socket_is_unreachable(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "control.sock"))
    stale.close()  # the file stays, nobody listens
    assert "nothing listens on" in _error(tmp_path)


def test_a_silent_peer_times_out(tmp_path: Path) -> None:
    done = threading.Event()
    with _listener(tmp_path / "control.sock", lambda _conn: done.wait(5)):
        try:
            assert "no reply in time" in _error(tmp_path)
        finally:
            done.set()


def test_a_peer_that_hangs_up_at_once(tmp_path: Path) -> None:
    with _listener(tmp_path / "control.sock", lambda _conn: None):
        assert "closed the connection" in _error(tmp_path)


def _answer_junk(conn: socket.socket) -> None:
    conn.recv(64)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 4)


def test_a_peer_that_is_not_zeromq(tmp_path: Path) -> None:
    with _listener(tmp_path / "control.sock", _answer_junk):
        assert "closed the connection during the ZeroMQ handshake" in _error(tmp_path)


def _ask_router(
    tmp_path: Path, answer: Answer, timeout_s: float = 1.0
) -> DaemonUnreachableError | DaemonRequestError:
    """`ask` against a ZeroMQ peer owning the daemon's socket that answers with `answer(request)`."""
    with StubDaemon(tmp_path / "control.sock", answer), pytest.raises(PerseusError) as info:
        ask(tmp_path, StatusRequest(), StatusReply, admin=False, timeout_s=timeout_s)
    assert isinstance(info.value, DaemonUnreachableError | DaemonRequestError)
    return info.value


def test_a_zeromq_peer_that_never_answers_times_out(tmp_path: Path) -> None:
    error = _ask_router(tmp_path, lambda _request: None)
    assert isinstance(error, DaemonUnreachableError)
    assert "no reply to status within 1 s" in str(error)


def test_a_reply_that_is_not_a_frame_is_a_bad_reply(tmp_path: Path) -> None:
    error = _ask_router(tmp_path, lambda _request: b"HTTP/1.1 200 OK")
    assert isinstance(error, DaemonRequestError)
    assert error.exit_code == 1
    assert "bad reply from the daemon" in str(error)


def test_a_reply_over_the_limit_drops_the_connection(tmp_path: Path) -> None:
    """libzmq drops a connection whose frame exceeds the limit (zmq.MAXMSGSIZE) without keeping it."""
    error = _ask_router(tmp_path, lambda _request: b"x" * (MAX_REPLY_BYTES + 1), timeout_s=5.0)
    assert isinstance(error, DaemonUnreachableError)
    assert "lost before a reply came" in str(error)
    assert f"over {MAX_REPLY_BYTES >> 20} MiB" in str(error)


def test_a_socket_path_too_long_for_zeromq_is_one_clear_error(tmp_path: Path) -> None:
    """The socket exists (bound through a relative path) but its absolute path exceeds what a socket
    address holds: an error naming the path, not a traceback."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(deep)
    try:
        listener.bind("control.sock")
    finally:
        os.chdir(cwd)
    try:
        message = _error(deep)
    finally:
        listener.close()
    assert f"cannot connect to {deep / 'control.sock'}" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the socket to another user")
def test_a_socket_of_another_user_is_never_talked_to(tmp_path: Path) -> None:
    """A process of another user that owns the socket path in a directory it does not own could stream a
    multipart reply without end (libzmq holds it whole before perseusctl sees a frame): perseusctl refuses
    the socket before it connects. (A daemon run as its own user owns its directory too: tests/daemon's
    unprivileged monitor.)"""
    path = tmp_path / "control.sock"
    endless = [b"x" * (1 << 20)] * 64
    with StubDaemon(path, lambda _request: endless) as stub:
        os.chown(path, 65534, 65534)
        error = _error(tmp_path)
        assert not stub.seen
    assert f"{path} belongs to uid 65534, neither root, you, nor its directory's owner (uid 0)" in error

"""perseusctl's standard-library ZeroMQ link when the other end is not a working daemon: each case is one
`DaemonUnreachableError` (exit 2), never a hang or a traceback. (Against real daemons it runs in every
`perseusctl` test.)"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perseus_client.status_messages import StatusReply, StatusRequest

from perseusd.ctl import zmtp
from perseusd.ctl.daemon_link import DaemonUnreachableError, ask

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
        assert "did not greet as ZeroMQ" in _error(tmp_path)


def _stream_frames(conn: socket.socket) -> None:
    """A process owning the socket path that answers with an endless multi-frame reply, each frame below
    the size limit of one frame; it gives up after 3x the reply limit."""
    conn.recv(64)
    conn.sendall(zmtp.GREETING + zmtp._frame(zmtp._ready(b"ROUTER"), zmtp.FLAG_COMMAND))
    frame = zmtp._frame(b"x" * (1 << 20), zmtp.FLAG_MORE)
    with contextlib.suppress(OSError):
        for _ in range(3 * zmtp.MAX_REPLY_BYTES // len(frame)):
            conn.sendall(frame)


def test_a_reply_is_capped_in_total_not_per_frame(tmp_path: Path) -> None:
    with _listener(tmp_path / "control.sock", _stream_frames), pytest.raises(DaemonUnreachableError) as info:
        ask(tmp_path, StatusRequest(), StatusReply, admin=False, timeout_s=20)
    assert f"a reply larger than {zmtp.MAX_REPLY_BYTES} bytes" in str(info.value)

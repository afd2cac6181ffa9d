"""sd_notify, watchdog interval and journal handler: checked against a datagram socket of our own."""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.daemon import sdnotify

RECV_TIMEOUT_S = 2.0


def _has_systemd_python() -> bool:
    try:
        from systemd import daemon  # noqa: F401
    except ImportError:
        return False
    return True


# Both implementations of notify: systemd-python (where installed) and the stdlib fallback.
IMPLEMENTATIONS = [
    pytest.param(
        "systemd-python",
        marks=pytest.mark.skipif(not _has_systemd_python(), reason="systemd-python is not installed"),
    ),
    pytest.param("stdlib"),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name: str = request.param
    if name == "stdlib":
        # A None entry in sys.modules makes `from systemd import daemon` raise ImportError.
        monkeypatch.setitem(sys.modules, "systemd.daemon", None)
    return name


def _bind(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(RECV_TIMEOUT_S)
    return sock


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify.sock"
    sock = _bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    name = f"perseusd-test-{uuid.uuid4().hex}"
    sock = _bind(b"\0" + name.encode())
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    yield sock
    sock.close()


@pytest.mark.usefixtures("implementation")
def test_notify_sends_the_exact_message(path_socket: socket.socket) -> None:
    message = "READY=1\nSTATUS=2 GPUs ready"
    assert sdnotify.notify(message) is True
    assert path_socket.recv(4096) == message.encode()


@pytest.mark.usefixtures("implementation")
def test_notify_to_abstract_socket(abstract_socket: socket.socket) -> None:
    assert sdnotify.notify("WATCHDOG=1") is True
    assert abstract_socket.recv(4096) == b"WATCHDOG=1"


@pytest.mark.usefixtures("implementation")
def test_each_notify_is_one_datagram(path_socket: socket.socket) -> None:
    for message in ("STATUS=starting", "READY=1", "WATCHDOG=1"):
        assert sdnotify.notify(message)
    received = [path_socket.recv(4096) for _ in range(3)]
    assert received == [b"STATUS=starting", b"READY=1", b"WATCHDOG=1"]


@pytest.mark.usefixtures("implementation")
def test_notify_without_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False


@pytest.mark.usefixtures("implementation")
def test_notify_to_missing_socket_returns_false(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert sdnotify.notify("READY=1") is False


def test_stdlib_rejects_relative_socket_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "systemd.daemon", None)
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/notify.sock")
    assert sdnotify.notify("READY=1") is False


@pytest.mark.parametrize(
    ("env", "expected_s"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "500000"}, 0.5),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "not-a-number"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "{self}"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "{other}"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected_s: float | None) -> None:
    pids = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}
    environ = {key: value.format(**pids) for key, value in env.items()}
    assert sdnotify.watchdog_interval_s(environ) == expected_s


def test_watchdog_interval_reads_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval_s() == 2.0


def test_no_journal_handler_outside_systemd() -> None:
    assert sdnotify.journal_handler({}) is None


def test_no_journal_handler_without_systemd_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "systemd.journal", None)
    assert sdnotify.journal_handler({"INVOCATION_ID": "abc"}) is None


@pytest.mark.skipif(not _has_systemd_python(), reason="systemd-python is not installed")
def test_journal_handler_under_systemd() -> None:
    handler = sdnotify.journal_handler({"JOURNAL_STREAM": "8:1234"})
    assert isinstance(handler, logging.Handler)
    assert type(handler).__name__ == "JournalHandler"

"""Four causes, four messages: no permission, daemon not running, wrong runtime directory, version mismatch.

Each message names its cause and what to do (which group to join for which socket, how to see why the
daemon is down, which variable sets the directory, which side to upgrade), and no other cause's words. A
strict client raises it; a fail-open client logs it once. Runs on every Python the client supports.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perseus_client import PerseusClient, PerseusClientError
from perseus_client.protocol import PROTOCOL_MAJOR

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes, run_as_user
from tests.support.stub_daemon import StubDaemon

pytestmark = pytest.mark.timeout(120)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody needs root")

CAUSES = {
    "permission": "no permission",
    "refused": "refused this user",
    "not running": "is not running",
    "wrong directory": "wrong runtime directory",
    "version": "speaks protocol",
}


def _only(message: str, cause: str) -> None:
    """`message` tells `cause` and no other."""
    told = [name for name, words in CAUSES.items() if words in message]
    assert told == [cause], message


def _strict_error(runtime_dir: Path) -> tuple[str, str]:
    try:
        PerseusClient(runtime_dir, job="probe", timeout_s=1.0, strict=True).close()
    except PerseusClientError as exc:
        return exc.code, exc.message
    return "ok", ""


@pytest.fixture
def make() -> Iterator[Callable[..., DaemonProcess]]:
    with daemon_processes() as factory:
        yield factory


def test_wrong_runtime_directory_names_the_variable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for where in (tmp_path / "missing", tmp_path):  # absent, or present without any perseusd socket
        code, message = _strict_error(where)
        assert code == "UNREACHABLE"
        _only(message, "wrong directory")
        assert "PERSEUSD_RUNTIME_DIR" in message
        assert str(where) in message
    caplog.set_level(logging.WARNING, logger="perseus_client")
    with PerseusClient(tmp_path / "missing", job="probe"):  # fail-open: the same words, logged once
        pass
    [record] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    _only(record.getMessage(), "wrong directory")


def test_the_variable_sets_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSEUSD_RUNTIME_DIR", str(tmp_path / "from-env"))
    with PerseusClient(job="probe", connect=False) as client:
        assert client.runtime_dir == tmp_path / "from-env"
    with PerseusClient(tmp_path / "given", job="probe", connect=False) as client:
        assert client.runtime_dir == tmp_path / "given"  # an explicit argument wins
    monkeypatch.delenv("PERSEUSD_RUNTIME_DIR")
    with PerseusClient(job="probe", connect=False) as client:
        assert client.runtime_dir == Path("/run/perseusd")


def test_daemon_not_running_when_its_socket_is_stale(make: Callable[..., DaemonProcess]) -> None:
    daemon = make(DaemonDirs.create(), gpus=1).start()
    daemon.signal(signal.SIGKILL)
    daemon.wait()
    code, message = _strict_error(daemon.dirs.runtime_dir)
    assert code == "UNREACHABLE"
    _only(message, "not running")
    assert str(daemon.dirs.runtime_dir / "control.sock") in message
    assert "journalctl -u perseusd" in message


@needs_root
def test_no_permission_names_the_group_and_the_socket(make: Callable[..., DaemonProcess]) -> None:
    daemon = make(DaemonDirs.create(), gpus=1).start()  # its runtime directory: 0750, not nobody's group
    runtime_dir = daemon.dirs.runtime_dir
    code, message = run_as_user(lambda: _strict_error(runtime_dir))
    assert code == "PERMISSION_DENIED"
    _only(message, "permission")
    assert str(runtime_dir / "control.sock") in message
    assert "join group perseus" in message


@needs_root
def test_refused_by_the_daemon_names_the_group_and_the_socket(make: Callable[..., DaemonProcess]) -> None:
    dirs = DaemonDirs.create()
    make(dirs, gpus=1, env={"PERSEUSD_SOCKET_GROUP": "perseus-test-missing"}).start()
    dirs.runtime_dir.chmod(0o755)  # the file system lets nobody in: the daemon's own check refuses
    for sock in dirs.runtime_dir.glob("*.sock"):
        sock.chmod(0o666)
    runtime_dir = dirs.runtime_dir
    code, message = run_as_user(lambda: _strict_error(runtime_dir))
    assert code == "PERMISSION_DENIED"
    _only(message, "refused")
    assert str(runtime_dir / "control.sock") in message
    assert "join group perseus" in message


def _other_major(major: int) -> Callable[[bytes], bytes]:
    """A daemon of another protocol major, as far as the wire goes: every reply is a frame of `major`."""

    def answer(request: bytes) -> bytes:
        body = {"v": major, "id": json.loads(request)["id"], "type": "hello_ok", "daemon_version": "x"}
        return json.dumps(body).encode()

    return answer


@pytest.mark.parametrize(("offset", "upgrade"), [(1, "upgrade this client"), (-1, "upgrade perseusd")])
def test_version_mismatch_names_the_side_to_upgrade(tmp_path: Path, offset: int, upgrade: str) -> None:
    stub = StubDaemon(tmp_path / "control.sock", _other_major(PROTOCOL_MAJOR + offset))
    try:
        code, message = _strict_error(tmp_path)
    finally:
        stub.close()
    assert code == "VERSION_MISMATCH"
    _only(message, "version")
    assert message.endswith(upgrade)

"""The runtime directory: its mode and group, the lock that keeps a second daemon away, stale sockets."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from perseusd.errors import PerseusError

logger = logging.getLogger(__name__)

LOCK_FILE_NAME = "perseusd.lock"
RUNTIME_DIR_MODE = 0o750
SOCKET_MODE = 0o660


class RuntimeDirError(PerseusError):
    """The runtime directory cannot be used; the message says what to fix."""


class DaemonRunningError(RuntimeDirError):
    """Another perseusd holds the runtime directory's lock."""


def prepare_runtime_dir(path: Path, group_gid: int | None) -> None:
    """Create the runtime directory (0750); hand it to the socket group when running as root."""
    path.mkdir(mode=RUNTIME_DIR_MODE, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"{path}: runtime directory is not a directory (symlink?); fix runtime_dir")
    if info.st_uid != os.geteuid():
        raise RuntimeDirError(f"{path}: runtime directory is owned by uid {info.st_uid}, not by perseusd")
    os.chmod(path, RUNTIME_DIR_MODE)
    set_group(path, group_gid)


def set_group(path: Path, gid: int | None) -> None:
    """chgrp when running as root and the group exists; skipped otherwise (unprivileged test runs)."""
    if gid is None or os.geteuid() != 0:
        return
    os.chown(path, -1, gid, follow_symlinks=False)


class DaemonLock:
    """An exclusive `flock` on `<runtime_dir>/perseusd.lock`, held for the daemon's lifetime."""

    def __init__(self, runtime_dir: Path) -> None:
        self.path = runtime_dir / LOCK_FILE_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DaemonRunningError(
                    f"another perseusd (pid {holder}) is running on {self.path.parent}; "
                    "stop it first (systemctl stop perseusd) or use another --runtime-dir"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def locked_runtime_dir(path: Path, group_gid: int | None) -> Iterator[None]:
    """The runtime directory prepared (`prepare_runtime_dir`) and its lock held until exit; raises
    `DaemonRunningError` when another perseusd holds it."""
    prepare_runtime_dir(path, group_gid)
    lock = DaemonLock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def reclaim_stale_socket(path: Path, kind: int = socket.SOCK_STREAM) -> bool:
    """Remove a socket file nobody serves (connect refused); True when one was removed. `kind`: the socket's
    type (a SOCK_SEQPACKET socket is probed as one).

    Raises when the path is not a socket, or when a live process still serves it.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        raise RuntimeDirError(f"{path}: exists and is not a socket; remove it by hand")
    with socket.socket(socket.AF_UNIX, kind) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)
            logger.warning("reclaimed stale socket %s", path)
            return True
        except OSError as exc:
            raise RuntimeDirError(f"{path}: cannot probe the socket: {exc.strerror}") from None
    raise RuntimeDirError(f"{path}: another process still serves this socket; stop it first")

"""Durable private files of the state directory: written atomically, read back only when safe.

Every file the daemon keeps in its state directory (the restore state file, the power cap, the pool's
original limits) is written here: a temporary file, every byte checked written, fsync, rename over the file,
fsync of the directory, mode 0600; a write that fails at any step raises `PrivateFileWriteError` and leaves
the previous file whole. A file is read back only when it is a regular file (not a symlink, FIFO or device)
owned by the daemon's user, not writable by group or others and of a sane size (`PrivateFileError`
otherwise). The system calls of a write go through `FILE_OPS`, the one seam fault-injection tests replace.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseusd.errors import PerseusError

MAX_PRIVATE_BYTES = 4 * 1024 * 1024


class PrivateFileError(PerseusError):
    """A private file is unsafe or cannot be read; the message names the file and what to check."""


class PrivateFileWriteError(PrivateFileError):
    """A private file could not be written durably; the previous file is untouched."""


@dataclass(frozen=True)
class FileOps:
    """The system calls a write makes (tests swap `FILE_OPS` to inject ENOSPC, EROFS, short writes)."""

    write: Callable[[int, bytes], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    replace: Callable[[Path, Path], None] = os.replace


FILE_OPS = FileOps()


def write_private_file(path: Path, data: bytes, what: str) -> None:
    """Write `data` to `path` durably (mode 0600): a temporary file, every byte checked written, fsync,
    rename over `path`, fsync of the directory. `PrivateFileWriteError` (naming `what`) when a step fails;
    `path` then still holds its previous content, whole."""
    ops = FILE_OPS
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        _write_file(tmp, data, ops)
        ops.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise PrivateFileWriteError(f"{path}: cannot write the {what}: {reason(exc)}") from None
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            ops.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise PrivateFileWriteError(f"{path}: {what} renamed but not synced: {reason(exc)}") from None


def _write_file(tmp: Path, data: bytes, ops: FileOps) -> None:
    """Create `tmp` and write all of `data` (short writes continued, none accepted) and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = ops.write(fd, bytes(view))
            if written <= 0:
                raise OSError(errno.ENOSPC, f"short write: {len(data) - len(view)} of {len(data)} bytes")
            view = view[written:]
        ops.fsync(fd)
        size = os.fstat(fd).st_size
        if size != len(data):
            raise OSError(errno.EIO, f"wrote {len(data)} bytes but the file has {size}")
    finally:
        os.close(fd)


def reason(exc: OSError) -> str:
    if exc.errno is None or exc.strerror is None:
        return str(exc)
    return f"[Errno {exc.errno}] {exc.strerror}"


def read_private_file(path: Path, what: str) -> bytes | None:
    """The bytes of a file `write_private_file` wrote (None: no file). `PrivateFileError` (naming `what`) for
    a symlink, a file that is not regular, not ours, writable by group or others, or too large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise PrivateFileError(
                f"{path}: {what} is a symlink; refusing it (remove it after checking)"
            ) from None
        raise PrivateFileError(f"{path}: cannot open {what}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        _check_file(path, info, what)
        raw = os.read(fd, MAX_PRIVATE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_PRIVATE_BYTES:
        raise PrivateFileError(f"{path}: {what} is larger than {MAX_PRIVATE_BYTES} bytes")
    return raw


def read_private_json(path: Path, what: str) -> Any | None:
    """The JSON value of a file `write_private_file` wrote (None: no file). `PrivateFileError` as
    `read_private_file`, and for bytes that are not JSON."""
    raw = read_private_file(path, what)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PrivateFileError(f"{path}: {what} is not valid JSON ({exc})") from None


def _check_file(path: Path, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise PrivateFileError(f"{path}: {what} is not a regular file; refusing it")
    if info.st_uid != os.geteuid():
        raise PrivateFileError(f"{path}: {what} is owned by uid {info.st_uid}, not by perseusd; refusing it")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PrivateFileError(f"{path}: {what} is writable by group or others; refusing it")

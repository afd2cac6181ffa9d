"""The restore state file: every GPU's original state, saved before the first write, and its lease holder.

Written atomically (temporary file, every byte checked written, fsync, rename, directory fsync): a write that
fails at any step (ENOSPC, EROFS, a short write) raises `StateWriteError`, removes the temporary file and
leaves the previous state.json whole. On load the file must be a regular file (not a symlink, FIFO or device)
owned by the daemon's user and not writable by others, and must match the schema; anything else is refused
with `StateFileError`, never silently discarded.

The file itself is written and read by `perseusd.private_file`, whose `FILE_OPS` is the one seam
fault-injection tests replace.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perseusd.gpu.backend import GpuState
from perseusd.private_file import (
    PrivateFileError,
    PrivateFileWriteError,
    read_private_file,
    reason,
    write_private_file,
)

SCHEMA_VERSION = 1
STATE_FILE_NAME = "state.json"


StateFileError = PrivateFileError
"""The state file is unsafe or malformed; the message says what to check."""
StateWriteError = PrivateFileWriteError
"""The state file could not be written durably; the previous file is untouched."""


@dataclass(frozen=True)
class SavedLease:
    """A lease holder as recorded: pid plus start time for the PID-reuse check."""

    pid: int
    start_time: int
    uid: int
    job: str


@dataclass(frozen=True)
class SavedGpu:
    """A GPU the daemon has written to (or may write to): its original state and current lease."""

    original: GpuState
    lease: SavedLease | None
    restore_error: str | None = None


@dataclass(frozen=True)
class StateRecord:
    daemon_pid: int
    daemon_start_time: int
    gpus: Mapping[str, SavedGpu] = field(default_factory=dict)


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE_NAME


def ensure_state_dir(state_dir: Path) -> None:
    """Create the state directory (0700) or check that the existing one is a real directory we own."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(state_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise StateFileError(f"{state_dir}: state directory is not a directory (symlink?); fix state_dir")
    if info.st_uid != os.geteuid():
        raise StateFileError(f"{state_dir}: state directory is owned by uid {info.st_uid}, not by perseusd")


def save_state(path: Path, record: StateRecord) -> None:
    """Write the record atomically: temp file, fsync, rename over `path`, fsync the directory.

    Raises `StateWriteError` when any step fails; `path` then still holds the previous record, whole.
    """
    write_private_file(path, json.dumps(_to_json(record), indent=1, sort_keys=True).encode(), "state file")


def remove_state(path: Path) -> None:
    """Remove the state file (nothing left to restore); `StateWriteError` when it cannot be removed."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise StateWriteError(f"{path}: cannot remove the state file: {reason(exc)}") from None


def load_state(path: Path) -> StateRecord | None:
    """Load and validate the state file; None when there is none."""
    raw = read_private_file(path, "state file")
    if raw is None:
        return None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateFileError(f"{path}: state file is not valid JSON ({exc}); move it aside") from None
    return _from_json(path, body)


def _to_json(record: StateRecord) -> dict[str, Any]:
    gpus: dict[str, Any] = {}
    for uuid, saved in record.gpus.items():
        lease = saved.lease
        gpus[uuid] = {
            "original": {
                "locked_sm_clock_mhz": saved.original.locked_sm_clock_mhz,
                "power_limit_w": saved.original.power_limit_w,
            },
            "lease": None
            if lease is None
            else {"pid": lease.pid, "start_time": lease.start_time, "uid": lease.uid, "job": lease.job},
            "restore_error": saved.restore_error,
        }
    return {
        "schema": SCHEMA_VERSION,
        "daemon": {"pid": record.daemon_pid, "start_time": record.daemon_start_time},
        "gpus": gpus,
    }


def _field(path: Path, obj: Any, key: str, kinds: tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise StateFileError(f"{path}: schema: missing '{where}{key}'")
    value = obj[key]
    if type(value) not in kinds:
        raise StateFileError(f"{path}: schema: '{where}{key}' has the wrong type")
    return value


def _from_json(path: Path, body: Any) -> StateRecord:
    if _field(path, body, "schema", (int,), "") != SCHEMA_VERSION:
        raise StateFileError(f"{path}: schema: unsupported version (expected {SCHEMA_VERSION})")
    daemon = _field(path, body, "daemon", (dict,), "")
    gpus_raw = _field(path, body, "gpus", (dict,), "")
    gpus = {str(uuid): _gpu_from_json(path, entry, f"gpus.{uuid}.") for uuid, entry in gpus_raw.items()}
    return StateRecord(
        daemon_pid=_field(path, daemon, "pid", (int,), "daemon."),
        daemon_start_time=_field(path, daemon, "start_time", (int,), "daemon."),
        gpus=gpus,
    )


def _gpu_from_json(path: Path, entry: Any, where: str) -> SavedGpu:
    original = _field(path, entry, "original", (dict,), where)
    clock = _field(path, original, "locked_sm_clock_mhz", (int, type(None)), where + "original.")
    limit = _field(path, original, "power_limit_w", (int, float), where + "original.")
    lease_raw = _field(path, entry, "lease", (dict, type(None)), where)
    lease = None
    if lease_raw is not None:
        lease = SavedLease(
            pid=_field(path, lease_raw, "pid", (int,), where + "lease."),
            start_time=_field(path, lease_raw, "start_time", (int,), where + "lease."),
            uid=_field(path, lease_raw, "uid", (int,), where + "lease."),
            job=_field(path, lease_raw, "job", (str,), where + "lease."),
        )
    error = _field(path, entry, "restore_error", (str, type(None)), where)
    return SavedGpu(GpuState(locked_sm_clock_mhz=clock, power_limit_w=float(limit)), lease, error)

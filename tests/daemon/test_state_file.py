"""The state file: atomic, schema-checked, and refusing anything an attacker could plant."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from perseusd.gpu.backend import GpuState
from perseusd.leasing.state_file import (
    SavedGpu,
    SavedLease,
    StateFileError,
    StateRecord,
    load_state,
    save_state,
)

RECORD = StateRecord(
    daemon_pid=10,
    daemon_start_time=20,
    gpus={"GPU-a": SavedGpu(GpuState(None, 400.0), SavedLease(pid=5, start_time=6, uid=0, job="j"))},
)


def test_round_trip_and_private_mode(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, RECORD)
    assert load_state(path) == RECORD
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left behind


def test_missing_is_none(tmp_path: Path) -> None:
    assert load_state(tmp_path / "state.json") is None


def test_symlink_refused(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    save_state(target, RECORD)
    (tmp_path / "state.json").symlink_to(target)
    with pytest.raises(StateFileError, match="symlink"):
        load_state(tmp_path / "state.json")


def test_fifo_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json", 0o600)
    with pytest.raises(StateFileError, match="not a regular file"):
        load_state(tmp_path / "state.json")


def test_group_writable_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, RECORD)
    path.chmod(0o620)
    with pytest.raises(StateFileError, match="writable"):
        load_state(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_wrong_owner_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, RECORD)
    os.chown(path, 65534, 65534)
    with pytest.raises(StateFileError, match="owned by uid 65534"):
        load_state(path)


@pytest.mark.parametrize(
    "body",
    [
        {"schema": 2, "daemon": {"pid": 1, "start_time": 1}, "gpus": {}},
        {"schema": 1, "daemon": {"pid": "1", "start_time": 1}, "gpus": {}},
        {"schema": 1, "daemon": {"pid": 1, "start_time": 1}, "gpus": {"g": {"original": {}}}},
        [],
    ],
)
def test_schema_violations_refused(tmp_path: Path, body: object) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(body))
    path.chmod(0o600)
    with pytest.raises(StateFileError, match="schema"):
        load_state(path)

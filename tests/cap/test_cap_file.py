"""The node budget's file: written durably (0600), read back, removed when empty, refused when malformed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseusd.cap.cap_file import CapFileError, SavedCap, cap_path, load_cap, save_cap


def test_saved_read_back_and_removed_when_empty(tmp_path: Path) -> None:
    path = cap_path(tmp_path)
    assert load_cap(path) is None
    save_cap(path, SavedCap(1200.5, "uid 0 pid 7", {"train-a": 0}))
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_cap(path) == SavedCap(1200.5, "uid 0 pid 7", {"train-a": 0})
    save_cap(path, SavedCap(None, "uid 0 pid 8", {"train-a": 0}))
    assert load_cap(path) == SavedCap(None, "uid 0 pid 8", {"train-a": 0})
    save_cap(path, SavedCap(None, "uid 0 pid 9", {}))
    assert not path.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file left


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("{", "not valid JSON"),
        (json.dumps({"version": 2, "budget_w": 100}), "not a version 1"),
        (json.dumps({"version": 1, "budget_w": -5}), "budget_w"),
        (json.dumps({"version": 1, "budget_w": True}), "budget_w"),
        (json.dumps({"version": 1, "budget_w": 100, "priorities": {"a": 7}}), "priority"),
        (json.dumps({"version": 1, "budget_w": 100, "set_by": 3}), "set_by"),
    ],
)
def test_a_malformed_file_is_refused(tmp_path: Path, body: str, why: str) -> None:
    path = cap_path(tmp_path)
    path.write_text(body)
    with pytest.raises(CapFileError, match=why):
        load_cap(path)


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"version": 1, "budget_w": 100}))
    cap_path(tmp_path).symlink_to(target)
    with pytest.raises(CapFileError, match="symlink"):
        load_cap(cap_path(tmp_path))


def test_an_unwritable_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CapFileError, match="cannot write the power cap file"):
        save_cap(tmp_path / "missing" / "power-cap.json", SavedCap(100.0))

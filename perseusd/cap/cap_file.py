"""The node budget and the job priorities, kept across a restart in `power-cap.json` in the state directory.

An admin who caps a node does not expect a crash (or a restart) to lift the cap. `cap set` and
`cap priority` write the file durably before they answer (mode 0600, as every file of the state directory:
`perseusd.private_file`); `cap clear` drops the budget from it (the file is removed
when no priority is left either). At start-up, once the crashed daemon's GPUs are reconciled and before any
job registers again, the daemon sets the budget again: GPUs without a plan are held by their power limits
alone until their jobs come back.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perseusd.power.allocate import PRIORITIES
from perseusd.private_file import PrivateFileError, read_private_json, write_private_file

logger = logging.getLogger(__name__)

FILE_NAME = "power-cap.json"
VERSION = 1
WHAT = "power cap file"


CapFileError = PrivateFileError
"""The file cannot be written, or what is there is not a power cap file."""


@dataclass(frozen=True)
class SavedCap:
    budget_w: float | None
    set_by: str = ""
    priorities: Mapping[str, int] = field(default_factory=dict)


def cap_path(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def save_cap(path: Path, cap: SavedCap) -> None:
    """Write (or, with no budget and no priority, remove) the file; `CapFileError` when it cannot."""
    if cap.budget_w is None and not cap.priorities:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise CapFileError(f"{path}: cannot remove the {WHAT}: {exc.strerror or exc}") from exc
        return
    body = {
        "version": VERSION,
        "budget_w": cap.budget_w,
        "set_by": cap.set_by,
        "priorities": dict(cap.priorities),
    }
    write_private_file(path, json.dumps(body, indent=1, sort_keys=True).encode(), WHAT)


def load_cap(path: Path) -> SavedCap | None:
    """The saved cap (None: no file); `CapFileError` for a file that is unsafe or not a power cap file."""
    body = read_private_json(path, WHAT)
    if body is None:
        return None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise CapFileError(f"{path}: not a version {VERSION} {WHAT}")
    budget_w, set_by, priorities = body.get("budget_w"), body.get("set_by", ""), body.get("priorities", {})
    budget_ok = budget_w is None or (
        isinstance(budget_w, int | float) and not isinstance(budget_w, bool) and math.isfinite(budget_w)
    )
    if not budget_ok or (budget_w is not None and budget_w <= 0):
        raise CapFileError(f"{path}: budget_w must be a number of watts > 0 or null")
    if not isinstance(set_by, str) or not isinstance(priorities, dict):
        raise CapFileError(f"{path}: set_by must be a string and priorities an object")
    if not all(isinstance(j, str) and type(p) is int and p in PRIORITIES for j, p in priorities.items()):
        raise CapFileError(f"{path}: each priority must be one of {', '.join(map(str, PRIORITIES))}")
    return SavedCap(None if budget_w is None else float(budget_w), set_by, dict(priorities))


def save_logged(path: Path, cap: SavedCap, last_error: str) -> str:
    """`save_cap`, an error logged (once while it repeats) and returned ("" once saved)."""
    try:
        save_cap(path, cap)
    except CapFileError as exc:
        if str(exc) != last_error:
            logger.error("power cap: not kept across a restart: %s", exc)
        return str(exc)
    return ""


def resume_saved(path: Path | None) -> tuple[SavedCap | None, str]:
    """At start-up: the saved cap (None: none, or unreadable) and why it could not be read ("" if it could).
    A file that cannot be read is logged and left in place."""
    if path is None:
        return None, ""
    try:
        saved = load_cap(path)
    except CapFileError as exc:
        logger.error("power cap: %s: left in place, no budget restored", exc)
        return None, str(exc)
    if saved is not None and saved.budget_w is not None:
        logger.warning(
            "power cap: node budget %.1f W (set by %s) kept across a restart: applied again",
            saved.budget_w,
            saved.set_by or "?",
        )
    return saved, ""

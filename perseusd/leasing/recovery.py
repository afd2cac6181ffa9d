"""Restoring a node whatever went wrong: a state file that cannot be read, a start that fails after the
backend opened, and `perseusd reset`.

A state file that cannot be read (too large, not JSON, planted) names nobody's originals, so every GPU
gets the driver's defaults (clocks unlocked, the default power limit) and the file is moved aside for an
operator (`state.json.unreadable-<time>`), never deleted: the next start, and `perseusd reset`, then work.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path

from perseusd.errors import GpuError
from perseusd.gpu.backend import GpuState
from perseusd.gpu.registry import GpuRegistry
from perseusd.leasing.restore import RestoreKeeper, RestoreOutcome
from perseusd.leasing.state_file import StateFileError, StateRecord, load_state

logger = logging.getLogger(__name__)

UNREADABLE_SUFFIX = ".unreadable-"


def restore_defaults(registry: GpuRegistry) -> RestoreOutcome:
    """Unlock clocks and set the default power limit on every GPU; one failing never stops the others."""
    restored: list[str] = []
    failed: list[str] = []
    for gpu in registry.uuids:
        default = GpuState(locked_sm_clock_mhz=None, power_limit_w=registry.info(gpu).power_limit_default_w)
        try:
            registry.restore(gpu, default)
        except GpuError as exc:
            logger.error("restoring the defaults of GPU %s failed: %s", gpu, exc)
            failed.append(gpu)
            continue
        restored.append(gpu)
    return RestoreOutcome(tuple(restored), tuple(failed))


def set_aside(path: Path) -> Path:
    """Move an unreadable state file out of the way (kept for inspection); `StateFileError` if it cannot."""
    aside = path.with_name(f"{path.name}{UNREADABLE_SUFFIX}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    try:
        os.rename(path, aside)
    except OSError as exc:
        raise StateFileError(f"{path}: cannot move the unreadable state file aside: {exc.strerror}") from None
    return aside


def read_or_recover(registry: GpuRegistry, path: Path) -> tuple[StateRecord | None, RestoreOutcome]:
    """The state file's record; when it cannot be read, every GPU gets its defaults and the file is moved
    aside (the record is then None). `StateFileError` only when the file cannot be moved aside."""
    try:
        return load_state(path), RestoreOutcome((), ())
    except StateFileError as exc:
        logger.error("%s: restoring every GPU to its defaults (clocks unlocked, default power limit)", exc)
    outcome = restore_defaults(registry)
    aside = set_aside(path)
    logger.error("unreadable state file moved to %s", aside)
    return None, outcome


def restore_recorded(registry: GpuRegistry, path: Path) -> RestoreOutcome:
    """Restore every GPU the state file records, live lease holders included (a start that failed: the
    daemon exits, so nobody keeps their GPU); an unreadable file gives every GPU its defaults."""
    try:
        record, outcome = read_or_recover(registry, path)
    except StateFileError as exc:
        logger.error("%s", exc)
        return RestoreOutcome((), ("state-file",))
    if record is None:
        return outcome
    keeper = RestoreKeeper(registry, path, daemon_pid=0, daemon_start_time=0)
    for gpu, saved in record.gpus.items():
        if gpu in registry:
            keeper.seed(gpu, replace(saved, lease=None))
        else:
            logger.error("state file names GPU %s which is not on this node; ignoring it", gpu)
    return keeper.restore_all()


def reset_node(registry: GpuRegistry, path: Path) -> RestoreOutcome:
    """`perseusd reset`: restore everything in the state file (the defaults when it cannot be read), then
    unlock clocks on every GPU."""
    outcome = restore_recorded(registry, path)
    problems: list[str] = []
    for gpu in registry.uuids:
        try:
            registry.reset_locked_sm_clock(gpu)
        except GpuError as exc:
            logger.error("unlocking clocks of GPU %s failed: %s", gpu, exc)
            if gpu not in outcome.failed:
                problems.append(gpu)
    return RestoreOutcome(outcome.restored, outcome.failed + tuple(problems))

"""Original power limits of the GPUs a uniform pool target holds, saved so a crash cannot leave them capped.

`power_pool_target = "uniform"` writes power limits from the pool agent's thread, apart from the main
state file (whose keeper belongs to the main loop). Before its first write under a grant it saves every
GPU's limit as it was into `pool-limits.json` in the state directory (durably, as every file of the state
directory: `perseusd.private_file`); when the grant is lifted and the limits are back the
file is removed. At start-up, before anything else writes a GPU, the daemon puts back the limits of a file a
crashed daemon left (`restore_pool_limits`), whatever its configuration is now.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from perseusd.private_file import PrivateFileError, read_private_json, write_private_file

logger = logging.getLogger(__name__)

FILE_NAME = "pool-limits.json"
VERSION = 1
WHAT = "pool limits file"


PoolLimitsFileError = PrivateFileError
"""The file cannot be written or read."""


class LimitSetter(Protocol):
    def set_power_limit_w(self, uuid: str, limit_w: float) -> float: ...


def pool_limits_path(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def save_originals(path: Path, limits_w: Mapping[str, float]) -> None:
    """Write the originals durably (see the module); `PoolLimitsFileError` when it cannot."""
    body = json.dumps({"version": VERSION, "power_limits_w": dict(limits_w)}, sort_keys=True).encode()
    write_private_file(path, body, WHAT)


def load_originals(path: Path) -> dict[str, float] | None:
    """The saved originals (None: no file); `PoolLimitsFileError` for a file that is not ours."""
    body = read_private_json(path, WHAT)
    if body is None:
        return None
    limits = body.get("power_limits_w") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or body.get("version") != VERSION
        or not isinstance(limits, dict)
        or not all(isinstance(u, str) and isinstance(w, int | float) and w > 0 for u, w in limits.items())
    ):
        raise PoolLimitsFileError(f"{path} is not a version {VERSION} pool limits file")
    return {u: float(w) for u, w in limits.items()}


def remove_originals(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        logger.error("power pool: cannot remove %s: %s", path, exc)


def restore_pool_limits(gpus: LimitSetter, known: set[str], state_dir: Path) -> list[str]:
    """At start-up: put back the limits a crashed daemon's uniform pool target left; the GPUs restored.

    The file is removed once every GPU in it that this node still has was restored; a file that cannot
    be read, or a GPU that fails, is logged and the file kept (the next start retries)."""
    path = pool_limits_path(state_dir)
    try:
        originals = load_originals(path)
    except PoolLimitsFileError as exc:
        logger.error("power pool: %s: left in place, power limits not restored", exc)
        return []
    if originals is None:
        return []
    restored, failed = [], []
    for uuid, limit_w in sorted(originals.items()):
        if uuid not in known:
            logger.warning("power pool: GPU %s of %s is not on this node: skipped", uuid, path)
            continue
        try:
            gpus.set_power_limit_w(uuid, limit_w)
        except Exception as exc:  # one GPU failing never stops the others
            logger.error(
                "power pool: restoring the power limit of %s to %.1f W failed: %s", uuid, limit_w, exc
            )
            failed.append(uuid)
            continue
        restored.append(uuid)
    if not failed:
        remove_originals(path)
    logger.warning("power pool: a previous daemon left pool power limits: restored %s", restored)
    return restored

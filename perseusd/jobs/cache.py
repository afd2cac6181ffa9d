"""The on-disk job cache: a job's profile and frontier, keyed by its signature (`shape.signature`).

`<state_dir>/jobs/<signature>/` holds `profile.csv` (with the job's waiting power by clock, when profiling
measured one: its `waiting_power` column), `frontier.json` and `job.json` (what the job was, its blocking
power). An entry written before the waiting power was kept has none, as before. Files are written
atomically and read strictly; a damaged entry is ignored (logged), never trusted. A frontier that is too
large, not a valid `perseus-frontier` document, for another shape or followed without counting its points'
late begins (an older daemon's) is ignored alone (the job solves again from the cached profile). A
restarted job or daemon finds its entry and skips profiling and solving. A frontier over
`INLINE_FRONTIER_BYTES` is not read here: the solver worker reads and checks it (`read_frontier_file`).
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseusd.errors import PerseusError, PlanningError
from perseusd.jobs.shape import JobShape
from perseusd.planner.plan import Frontier, save_json
from perseusd.planner.plan_read import parse_frontier
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints, profile_to_csv, read_profile_waiting

logger = logging.getLogger(__name__)

_SIGNATURE = re.compile(r"^[0-9a-f]{16,64}$")
MAX_FRONTIER_BYTES = 64 * 1024 * 1024
INLINE_FRONTIER_BYTES = 1024 * 1024
"""A cached frontier up to this size is read at registration, on the daemon's main loop (~60 ms); a larger
one by the solver worker (`SolveInput.cached_frontier`): reading a 4 x 16 job's 3.5-5.7 MB takes 0.2-0.4
s, an 8 x 32 job's 17 MB 1.5 s, and the main loop would serve no event or request meanwhile."""


@dataclass(frozen=True)
class CacheEntry:
    profile: Profile
    p_block_w: float
    frontier: Frontier | None
    waiting_w: WaitingPoints = ()
    """The waiting power by held clock stored with the profile (empty: none)."""
    frontier_file: Path | None = None
    """A cached frontier over `INLINE_FRONTIER_BYTES`, not read here: the solver worker reads and checks it
    (`load_frontier_file`) when the job is complete (None: none, or `frontier` was read)."""


class JobCache:
    """Profiles and frontiers of past jobs under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, signature: str) -> Path:
        if not _SIGNATURE.match(signature):
            raise ValueError(f"bad cache signature {signature!r}")
        return self.root / signature

    def load(self, signature: str, shape: JobShape) -> CacheEntry | None:
        folder = self._dir(signature)
        if not (folder / "profile.csv").is_file():
            return None
        try:
            text = (folder / "profile.csv").read_text(encoding="utf-8")
            profile, waiting_w = read_profile_waiting(io.StringIO(text), str(folder / "profile.csv"))
            meta = json.loads((folder / "job.json").read_text(encoding="utf-8"))
            p_block_w = float(meta["p_block_w"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError, PerseusError) as exc:
            logger.warning("job cache %s is damaged, ignoring it: %s", folder, exc)
            return None
        path = folder / "frontier.json"
        if INLINE_FRONTIER_BYTES < _size(path) <= MAX_FRONTIER_BYTES:
            return CacheEntry(profile, p_block_w, None, waiting_w, path)
        return CacheEntry(profile, p_block_w, load_frontier_file(path, shape, profile), waiting_w)

    def store_profile(
        self,
        signature: str,
        profile: Profile,
        p_block_w: float,
        about: dict[str, Any],
        waiting_w: WaitingPoints = (),
    ) -> None:
        folder = self._dir(signature)
        folder.mkdir(parents=True, exist_ok=True, mode=0o750)
        (folder / "frontier.json").unlink(missing_ok=True)  # a new profile invalidates the frontier
        for left in folder.glob(".frontier.json.*.tmp"):  # a worker's write cut short (`store_after`)
            left.unlink(missing_ok=True)
        tmp = folder / ".profile.csv.tmp"
        tmp.write_text(profile_to_csv(profile, waiting_w), encoding="utf-8")
        tmp.replace(folder / "profile.csv")
        save_json(about | {"p_block_w": p_block_w}, folder / "job.json", indent=2)

    def frontier_path(self, signature: str) -> Path:
        """Where the frontier of `signature`'s job is kept: the solver worker writes it (`store_after`), only
        where `store_profile` made the folder."""
        return self._dir(signature) / "frontier.json"


def _size(path: Path) -> int:
    """The file's size in bytes (0: none, or it cannot be read: `load_frontier_file` says why)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


class FrontierFileError(PlanningError):
    """A cached frontier that cannot be used; the message says why (the job solves again)."""


def load_frontier_file(path: Path, shape: JobShape, profile: Profile) -> Frontier | None:
    """`read_frontier_file`, or None when there is no file or it cannot be used (logged)."""
    if not path.is_file():
        return None
    try:
        return read_frontier_file(path, shape, profile)
    except FrontierFileError as exc:
        logger.warning("job cache: ignoring frontier %s (solving again): %s", path, exc)
        return None


def read_frontier_file(path: Path, shape: JobShape, profile: Profile) -> Frontier:
    """The cached frontier when its document is whole, valid, for `shape` and solved from `profile` (the
    worker writes it after the solve: a frontier of an older profile may land after a newer profile was
    stored); `FrontierFileError` saying why not otherwise. Runs on the daemon's main loop or in the solver
    worker (`SolveInput.cached_frontier`)."""
    try:
        size = path.stat().st_size
        if size > MAX_FRONTIER_BYTES:
            raise ValueError(f"{size} bytes is more than {MAX_FRONTIER_BYTES}")
        text = path.read_text(encoding="utf-8")
        frontier = parse_frontier(text, str(path))
        meta = frontier.meta
        found = (meta.num_stages, meta.num_microbatches, meta.num_chunks)
        expected = (shape.num_stages, shape.num_microbatches, shape.chunks)
        if found != expected:
            raise ValueError(f"frontier is for stages/microbatches/chunks {found}, not {expected}")
        if meta.profile_digest != profile.digest():
            raise ValueError("it was solved from another profile than the one cached")
        if any(p.followed is not None and p.followed.late_begins is None for p in frontier.points):
            raise ValueError("its points do not count their late begins (written by an older daemon)")
    except (OSError, ValueError, KeyError, TypeError, RecursionError, PerseusError) as exc:
        raise FrontierFileError(str(exc)) from None
    return frontier

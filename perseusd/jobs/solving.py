"""What the solver worker process runs for a job: its frontier solved from plain data, or its cached one read.

The worker gets only data (`SolveInput`: the profile as CSV text, the per-stage orders, numbers) and returns
the typed, immutable `Frontier` (its JSON document is written only where text is needed: the cache file, the
reply to `perseusctl frontier`) with how long each phase took (`Solved`); nothing from a request is ever
executed. The worker process itself (started, capped, cancelled, stopped) is `jobs.solve_worker`'s; a job's
solve is submitted and collected by `jobs.solve_dispatch`.
"""

from __future__ import annotations

import io
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from perseusd.errors import PlanningError
from perseusd.jobs.cache import FrontierFileError, read_frontier_file
from perseusd.jobs.shape import JobShape, StageOrder
from perseusd.planner.baselines import all_max
from perseusd.planner.descent_limits import descend_frontier
from perseusd.planner.following import follow_frontier
from perseusd.planner.plan import Frontier, PlanMeta, frontier_from_points, frontier_to_document, save_json
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import read_profile_stream
from perseusd.planner.solver import FrontierSolver, SolverParams
from perseusd.planner.switching import SwitchModel
from perseusd.planner.waiting import WaitingPower
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

UNIT_FRACTION = 50
"""The time quantum is at most the shortest computation / this (1 ms for GPT-3 on A100, as published)."""


@dataclass(frozen=True)
class SolveInput:
    """Everything the worker needs, as plain data."""

    job: str
    shape: JobShape
    orders: tuple[StageOrder, ...]
    profile_csv: str
    profile_source: str
    p_block_w: float
    unit_time_s: float
    switch: SwitchModel | None = None
    """The GPUs' clock switching (measured latency); None: switches are taken as instant."""
    waiting_w: tuple[tuple[int, float], ...] = ()
    """The GPUs' waiting power by held clock, (MHz, W) measured ascending (`WaitingPower`); empty:
    `p_block_w` at every clock. Used where plans are followed (with a switch model)."""
    frontier_cache: str | None = None
    """The job cache's frontier file (`JobCache.frontier_path`, the daemon's own path, never a request's):
    the worker writes the frontier's document there after returning it (`store_after`); None: nowhere."""
    cached_frontier: str | None = None
    """A cached frontier too large to read on the daemon's main loop (`JobCache`, the daemon's own path,
    never a request's): the worker reads and checks it instead of solving and returns it, or raises
    `FrontierFileError` (the daemon then submits the solve)."""


def auto_unit_time_s(profile: Profile) -> float:
    """The largest 1-2-5 step at most the shortest computation time / `UNIT_FRACTION`."""
    shortest_s = min(m.time_s for m in profile.measurements)
    limit_s = shortest_s / UNIT_FRACTION
    exponent = math.floor(math.log10(limit_s))
    for mantissa in (5.0, 2.0, 1.0):
        step_s = mantissa * 10.0**exponent
        if step_s <= limit_s * (1 + 1e-9):
            return float(f"{step_s:.3g}")
    return float(f"{10.0**exponent:.3g}")


@dataclass(frozen=True)
class SolvePhases:
    """How long each phase of a solve took in the worker (s)."""

    fit_s: float
    """Option sets and cost models (`FrontierSolver` built)."""
    frontier_s: float
    """The frontier's points, each with its time on the measured profile."""
    follow_s: float = 0.0
    """Every point followed under the switch model (none without one)."""
    descent_s: float = 0.0
    """The switch-aware descent."""

    @property
    def total_s(self) -> float:
        return self.fit_s + self.frontier_s + self.follow_s + self.descent_s


@dataclass(frozen=True)
class Solved:
    """What the worker returns: the frontier and how long its phases took."""

    frontier: Frontier
    phases: SolvePhases
    read_s: float | None = None
    """Read from the job cache (`SolveInput.cached_frontier`) in this many seconds, not solved (None)."""


@dataclass(frozen=True)
class PlanningTimes:
    """From profiling done to the plan deployed (s), by phase: the worker's (`phases`) and `transfer_s`, the
    rest: waiting for the worker, moving the frontier to the daemon, collecting it and installing the plan."""

    total_s: float
    phases: SolvePhases

    @property
    def transfer_s(self) -> float:
        return max(0.0, self.total_s - self.phases.total_s)

    def describe(self) -> str:
        """`fit 0.012 s, frontier 0.031 s, follow 0.074 s, descent 0.420 s, transfer 0.102 s`."""
        p = self.phases
        named = (("fit", p.fit_s), ("frontier", p.frontier_s), ("follow", p.follow_s))
        rest = (("descent", p.descent_s), ("transfer", self.transfer_s))
        return ", ".join(f"{name} {value_s:.3f} s" for name, value_s in (*named, *rest))


def solve(task: SolveInput) -> Solved:
    """Runs in the worker: the job's full frontier, each point with its time on the measured profile; with a
    switch model, every point followed under it and the switch-aware descent's points appended.

    Errors come back as `PlanningError` with the message only: every exception must survive pickling
    back to the daemon, or the pool breaks. With `cached_frontier`, the cached frontier instead
    (`read_cached`).
    """
    try:
        if task.cached_frontier is not None:
            return read_cached(task, task.cached_frontier)
        started_s = time.perf_counter()
        profile = read_profile_stream(io.StringIO(task.profile_csv), task.profile_source)
        dag = task.shape.dag(task.orders)
        params = SolverParams(unit_time_s=task.unit_time_s, p_block_w=task.p_block_w)
        solver = FrontierSolver(dag, profile, params)
        fitted_s = time.perf_counter()
        points = list(solver.points())
        meta = PlanMeta.for_dag(dag, profile, task.unit_time_s, task.p_block_w)
        refined_times_s = [point.refined_time_s for point in points]  # the predicted time, measured values
        frontier = frontier_from_points(dag, points, meta, refined_times_s)
        solved_s = followed_s = descended_s = time.perf_counter()
        if task.switch is not None:
            waiting = WaitingPower(task.p_block_w, task.waiting_w)
            frontier = follow_frontier(frontier, dag, profile, task.p_block_w, task.switch, waiting)
            followed_s = time.perf_counter()
            all_max_time_s = all_max(dag, profile, task.p_block_w).time_s
            frontier = descend_frontier(
                frontier, dag, profile, task.p_block_w, task.switch, all_max_time_s, waiting=waiting
            )
            descended_s = time.perf_counter()
        phases = SolvePhases(
            fitted_s - started_s, solved_s - fitted_s, followed_s - solved_s, descended_s - followed_s
        )
        if task.frontier_cache is not None:
            store_after(frontier, Path(task.frontier_cache))
        return Solved(frontier, phases)
    except FrontierFileError:
        raise
    except Exception as exc:
        raise PlanningError(f"{type(exc).__name__}: {exc}") from None


def read_cached(task: SolveInput, path: str) -> Solved:
    """Runs in the worker: the job's cached frontier at `path`, checked against its shape and profile
    (`read_frontier_file`); `FrontierFileError` (its message only) when it cannot be used."""
    started_s = time.perf_counter()
    try:
        profile = read_profile_stream(io.StringIO(task.profile_csv), task.profile_source)
        frontier = read_frontier_file(Path(path), task.shape, profile)
    except FrontierFileError:
        raise
    except Exception as exc:  # a profile the cache could not have written: solve instead
        raise FrontierFileError(f"{type(exc).__name__}: {exc}") from None
    return Solved(frontier, SolvePhases(0.0, 0.0), read_s=time.perf_counter() - started_s)


def store_after(frontier: Frontier, path: Path) -> threading.Thread:
    """Runs in the worker: write `frontier`'s document to `path` on a thread of the worker's own, so that the
    solve returns at once. The document of a long job's frontier is large (an 8 x 32 job's 27,000 points:
    70 MB, 4.7 s to build and write); written by the daemon after deploying, it held the daemon's main loop
    that long, and with it every event and request (the deployed plan began ~6 s late). A write cut short
    (the worker exits with the daemon) leaves only its temporary file (`save_json`), which the cache
    removes (`JobCache.store_profile`)."""

    def write() -> None:
        try:
            if path.parent.is_dir():
                save_json(frontier_to_document(frontier), path)
        except (OSError, ValueError, MemoryError) as exc:  # the worker's cap: its solves go on
            logger.warning("cannot cache the frontier in %s: %s", path, exc or type(exc).__name__)

    writer = NamedThread(target=write, name="frontier-cache", daemon=True)
    writer.start()
    return writer

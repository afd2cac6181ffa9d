"""Solving a job's frontier in a worker process, so the daemon keeps serving while the solver runs.

The worker gets only data (the profile as CSV text, the per-stage orders, numbers) and returns the typed,
immutable `Frontier` (its JSON document is written only where text is needed: the cache file, the reply to
`perseusctl frontier`) with how long each phase took (`Solved`); nothing from a request is ever executed.
One worker process serves every job, one solve at a time, started from a `forkserver` (never a fork of the
threaded daemon) on first use or when `warm` is called (the manager does when a job starts profiling, so
that its solve finds the worker ready).
`close` stops the worker (a solve in progress is abandoned) and waits for it; a worker also exits by itself
when the daemon dies (SIGKILL included: it watches the daemon's pidfd), so neither it nor the forkserver and
resource tracker it keeps alive outlive the daemon.
The worker's memory is capped (`RLIMIT_DATA`, `solver_memory_limit_mib`): a solve that needs more fails its
own job with a clear error (`MemoryError` inside the worker, which lives on for the other jobs' solves)
instead of growing until the kernel's OOM killer takes the worker, and every queued solve with it.
"""

from __future__ import annotations

import io
import logging
import math
import multiprocessing
import os
import resource
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
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

CLOSE_TIMEOUT_S = 10.0
"""How long `close` waits for the worker after SIGTERM before SIGKILL."""

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


def ready() -> int:
    """Runs in the worker: nothing (`SolveWorker.warm` starts the process and its imports with it)."""
    return os.getpid()


def start_worker(daemon_pid: int, memory_limit_bytes: int | None) -> None:
    """Runs first in the worker: cap its memory, and exit with the daemon."""
    if memory_limit_bytes is not None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            memory_limit_bytes = min(memory_limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit_bytes, hard))
    exit_with(daemon_pid)


def solve_within_memory(solve_fn: Callable[[SolveInput], Solved], task: SolveInput) -> Solved:
    """Runs in the worker: `solve_fn`, a solve that outgrows the worker's memory cap failing alone."""
    try:
        return solve_fn(task)
    except MemoryError:
        limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
        cap = "its limit" if limit == resource.RLIM_INFINITY else f"{limit / 2**20:.0f} MiB"
        raise PlanningError(
            f"the solve needed more memory than the solver may use ({cap}, solver_memory_limit_mib): "
            "plan a smaller shape"
        ) from None


def exit_with(daemon_pid: int) -> None:
    """Exit the worker as soon as the daemon process is gone (whatever killed it)."""
    try:
        pidfd = os.pidfd_open(daemon_pid)
    except OSError:  # already gone
        os._exit(0)

    def watch() -> None:
        select.select([pidfd], [], [])
        os._exit(0)

    NamedThread(target=watch, name="daemon-watch", daemon=True).start()


class SolveWorker:
    """One background solver process; `submit` never waits for a solve.

    Starting the process (the forkserver, the worker, its imports) takes most of a second of the caller's
    time: `warm` does it on a thread of its own, so the daemon's main loop never waits for it unless a solve
    is submitted while the start is under way (or without `warm`, at the first solve).

    `cancel` abandons a solve nobody waits for any more (its job ended): a queued one is dropped; the running
    one stops the worker process (its memory and core freed at once) and the other jobs' solves are
    submitted again to a fresh one, unseen by their callers."""

    def __init__(
        self, solve_fn: Callable[[SolveInput], Solved] = solve, memory_limit_mib: int | None = None
    ) -> None:
        """`memory_limit_mib`: the worker's data segment cap (None: no cap)."""
        self._memory_limit_bytes = None if memory_limit_mib is None else memory_limit_mib * 2**20
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None
        self._solve_fn = solve_fn
        self._inflight: dict[Future[Solved], tuple[SolveInput, Future[Solved] | None]] = {}
        self.cancelled = 0
        """Solves abandoned by `cancel`."""

    def submit(self, task: SolveInput) -> Future[Solved]:
        """Queue a solve; a worker that died (killed, out of memory) is replaced, never fatal."""
        outer: Future[Solved] = Future()
        with self._lock:
            self._start(outer, task)
        return outer

    def _start(self, outer: Future[Solved], task: SolveInput) -> None:
        inner = self._submit_inner(task)
        self._inflight[outer] = (task, inner)
        inner.add_done_callback(lambda done: self._finished(outer, done))

    def _submit_inner(self, task: SolveInput) -> Future[Solved]:
        for _ in range(2):
            try:
                return self._started().submit(solve_within_memory, self._solve_fn, task)
            except BrokenProcessPool:
                self._stop()
        failed: Future[Solved] = Future()
        failed.set_exception(PlanningError("the solver worker could not be started"))
        return failed

    def _finished(self, outer: Future[Solved], inner: Future[Solved]) -> None:
        """The worker's future is done: pass its outcome on, unless it was superseded or abandoned (dict
        operations only: this runs on the executor's threads, also while `cancel` holds the lock)."""
        entry = self._inflight.get(outer)
        if entry is None or entry[1] is not inner:
            return
        self._inflight.pop(outer, None)
        if outer.done():
            return
        if inner.cancelled():
            outer.set_exception(PlanningError("the solve was cancelled"))
        elif (exc := inner.exception()) is not None:
            outer.set_exception(exc)
        else:
            outer.set_result(inner.result())

    def cancel(self, outer: Future[Solved]) -> None:
        """Abandon the solve of `outer` (a no-op when it is done or unknown); `outer` ends cancelled."""
        with self._lock:
            entry = self._inflight.pop(outer, None)
            if entry is None:
                return
            self.cancelled += 1
            outer.cancel()
            _task, inner = entry
            if inner is None or inner.cancel():
                return  # still queued: dropped
            others = [(other, task) for other, (task, _inner) in self._inflight.items()]
            for other, task in others:
                self._inflight[other] = (task, None)  # their worker futures fail now: not theirs any more
            self._stop()
            for other, task in others:
                self._start(other, task)

    @property
    def inflight(self) -> int:
        """Solves submitted and not yet done."""
        return len(self._inflight)

    @property
    def starting(self) -> bool:
        """`warm` is starting the worker process: a `submit` now would wait for the start."""
        return self._warming is not None

    def warm(self) -> None:
        """Start the worker process (and its imports) on a thread, if it is not running or starting: the
        next solve then starts at once. Never fails: a worker that cannot start fails its solve instead."""
        with self._lock:
            if self._pool is not None or self._warming is not None:
                return
            self._warming = NamedThread(target=self._warm, name="solver-warm", daemon=True)
            self._warming.start()

    def _warm(self) -> None:
        with self._lock:
            try:
                self._started().submit(ready)
            except Exception:  # the worker cannot start: its solve will say so
                logger.warning("the solver worker could not be started ahead of its solve", exc_info=True)
                self._stop()
            finally:
                self._warming = None

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=context,
                initializer=start_worker,
                initargs=(os.getpid(), self._memory_limit_bytes),
            )
        return self._pool

    def close(self) -> None:
        """Cancel queued solves, stop the worker process and wait until it has exited."""
        warming = self._warming
        if warming is not None:
            warming.join()
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._pool is not None:
            _stop_pool(self._pool)
            self._pool = None


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Shut `pool` down without waiting for a running solve: terminate its processes, then reap them."""
    processes: list[BaseProcess] = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(CLOSE_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join(CLOSE_TIMEOUT_S)
    pool.shutdown(wait=True)

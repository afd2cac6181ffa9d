"""The solver worker process, so the daemon keeps serving while the solver runs (`SolveWorker`).

One worker process serves every job, one solve at a time (`jobs.solving.solve`, or the `solve_fn` given),
started from a `forkserver` (never a fork of the threaded daemon) on first use or when `warm` is called (the
manager does when a job starts profiling, so that its solve finds the worker ready).
`close` stops the worker (a solve in progress is abandoned) and waits for it; a worker also exits by itself
when the daemon dies (SIGKILL included: it watches the daemon's pidfd), so neither it nor the forkserver and
resource tracker it keeps alive outlive the daemon.
The worker's memory is capped (`RLIMIT_DATA`, `solver_memory_limit_mib`): a solve that needs more fails its
own job with a clear error (`MemoryError` inside the worker, which lives on for the other jobs' solves)
instead of growing until the kernel's OOM killer takes the worker, and every queued solve with it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import resource
import select
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess

from perseusd.errors import PlanningError
from perseusd.jobs.solving import Solved, SolveInput, solve
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0
"""How long `close` waits for the worker after SIGTERM before SIGKILL."""


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

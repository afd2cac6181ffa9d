"""Saving originals before the first write and restoring them: on release, client death, SIGTERM, after a
daemon crash (reconcile from the state file) and in `perseusd reset`. One GPU failing never stops the others.

Persistence: a GPU is written only after its original is durably in state.json (`ensure_saved` raises
`StateWriteError` otherwise). A write that fails after a restore (full or read-only state directory) never
stops the daemon: the state stays in memory, the write is retried from the main loop (1 s, doubling to
30 s) and `persistence_error` says what fails until a write succeeds again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from perseusd.errors import GpuError
from perseusd.gpu.backend import GpuState
from perseusd.gpu.registry import GpuRegistry
from perseusd.leasing.identity import Caller, same_process_alive
from perseusd.leasing.leases import Lease, LeaseBook
from perseusd.leasing.state_file import (
    SavedGpu,
    SavedLease,
    StateRecord,
    StateWriteError,
    load_state,
    remove_state,
    save_state,
)

logger = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


@dataclass(frozen=True)
class RestoreOutcome:
    restored: tuple[str, ...]
    failed: tuple[str, ...]


class RestoreKeeper:
    """Owns the state file: the original state of every GPU the daemon may have written, and its lease."""

    def __init__(
        self,
        registry: GpuRegistry,
        path: Path,
        daemon_pid: int,
        daemon_start_time: int,
        *,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._path = path
        self._daemon_pid = daemon_pid
        self._daemon_start_time = daemon_start_time
        self._clock_s = clock_s
        self._saved: dict[str, SavedGpu] = {}
        self._written: dict[str, GpuState] = {}  # the originals in the file on disk
        self.restores = 0
        self.persist_enabled = True
        self.restore_failures = 0
        self.persist_failures = 0
        self._dirty = False
        self._error: str | None = None
        self._failing_since_s = 0.0
        self._retry_delay_s = RETRY_FIRST_S
        self._next_retry_s = 0.0

    def saved(self, gpu: str) -> SavedGpu | None:
        return self._saved.get(gpu)

    def seed(self, gpu: str, saved: SavedGpu) -> None:
        """Take a saved original from elsewhere (the state file, for `perseusd reset`)."""
        self._saved[gpu] = saved

    def ensure_saved(self, gpu: str) -> None:
        """Save the GPU's current state as its original unless one is already saved, and make sure that
        original is durably in the state file: call before any write; `StateWriteError` means do not write.
        """
        fresh = gpu not in self._saved
        if fresh:
            self._saved[gpu] = SavedGpu(original=self._registry.save_state(gpu), lease=None)
        if self.persist_enabled and self._written.get(gpu) != self._saved[gpu].original:
            try:
                self.persist()
            except StateWriteError:
                if fresh:
                    self.discard(gpu)
                raise

    def discard(self, gpu: str) -> None:
        """Forget a GPU's saved original: only for a GPU nothing was written to (an undone claim)."""
        self._saved.pop(gpu, None)

    def record_lease(self, gpu: str, lease: Lease | None) -> None:
        saved = self._saved[gpu]
        saved_lease = None if lease is None else SavedLease(lease.pid, lease.start_time, lease.uid, lease.job)
        self._saved[gpu] = replace(saved, lease=saved_lease)

    def restore(self, gpus: Iterable[str]) -> RestoreOutcome:
        """Restore each GPU's original state; failures are logged, recorded and never stop the others."""
        restored: list[str] = []
        failed: list[str] = []
        for gpu in gpus:
            saved = self._saved.get(gpu)
            if saved is None:
                continue
            try:
                self._registry.restore(gpu, saved.original)
            except GpuError as exc:
                logger.error("restoring GPU %s failed: %s (recorded; `perseusd reset` retries)", gpu, exc)
                self._saved[gpu] = replace(saved, lease=None, restore_error=str(exc))
                failed.append(gpu)
                continue
            del self._saved[gpu]
            restored.append(gpu)
        self.restores += len(restored)
        self.restore_failures += len(failed)
        if restored or failed:
            self.persist_or_retry()
        return RestoreOutcome(tuple(restored), tuple(failed))

    def restore_all(self) -> RestoreOutcome:
        return self.restore(list(self._saved))

    def persist(self) -> None:
        """Write the state file atomically (removed when there is nothing left to restore).

        Raises `StateWriteError` when it cannot; the state stays in memory and the main loop retries.
        """
        if not self.persist_enabled:
            return
        try:
            if self._saved:
                record = StateRecord(self._daemon_pid, self._daemon_start_time, dict(self._saved))
                save_state(self._path, record)
            else:
                remove_state(self._path)
        except StateWriteError as exc:
            self._write_failed(exc)
            raise
        self._write_succeeded()

    def persist_or_retry(self) -> bool:
        """`persist`, but a failure is only recorded (status, log) and retried later; True when written."""
        try:
            self.persist()
        except StateWriteError:
            return False
        return True

    def retry_persist(self) -> None:
        """From the main loop: retry a failed write when its back-off has passed."""
        if self._dirty and self._clock_s() >= self._next_retry_s:
            self.persist_or_retry()

    @property
    def persistence_error(self) -> str | None:
        """What fails while state changes are only in memory (None when the file is up to date)."""
        if not self._dirty:
            return None
        failing_s = self._clock_s() - self._failing_since_s
        return (
            f"state file not written for {failing_s:.0f} s ({self.persist_failures} failed writes): "
            f"{self._error}; state kept in memory, retrying"
        )

    def _write_failed(self, exc: StateWriteError) -> None:
        now_s = self._clock_s()
        if not self._dirty:
            self._failing_since_s = now_s
            self._retry_delay_s = RETRY_FIRST_S
        else:
            self._retry_delay_s = min(self._retry_delay_s * 2, RETRY_MAX_S)
        self._dirty = True
        self._error = str(exc)
        self.persist_failures += 1
        self._next_retry_s = now_s + self._retry_delay_s
        logger.error(
            "PERSISTENCE FAILING: %s (state kept in memory; retry in %.0f s)", exc, self._retry_delay_s
        )

    def _write_succeeded(self) -> None:
        if self._dirty:
            logger.warning("state file written again after %d failed writes", self.persist_failures)
        self._dirty = False
        self._error = None
        self._written = {gpu: saved.original for gpu, saved in self._saved.items()}

    def reconcile(self, leases: LeaseBook) -> RestoreOutcome:
        """After a restart: adopt leases whose holder still lives (PID-reuse checked), restore the rest."""
        record = load_state(self._path)
        if record is None:
            return RestoreOutcome((), ())
        self._written = {gpu: saved.original for gpu, saved in record.gpus.items()}
        logger.warning(
            "found state of a previous daemon (pid %d) with %d GPU(s): reconciling",
            record.daemon_pid,
            len(record.gpus),
        )
        to_restore: list[str] = []
        for gpu, saved in record.gpus.items():
            if gpu not in self._registry:
                logger.error("state file names GPU %s which is not on this node; dropping it", gpu)
                continue
            self._saved[gpu] = saved
            if not self._adopt(leases, gpu, saved):
                to_restore.append(gpu)
        return self.restore(to_restore)

    def _adopt(self, leases: LeaseBook, gpu: str, saved: SavedGpu) -> bool:
        lease = saved.lease
        if lease is None or not same_process_alive(lease.pid, lease.start_time):
            return False
        session = leases.session(lease.pid)
        if session is not None:
            leases.claim(session, gpu)
            return True
        # The caller's gid is not recorded; the uid decides ownership.
        caller = Caller(uid=lease.uid, gid=-1, pid=lease.pid)
        adopted = leases.adopt(caller, lease.start_time, lease.job, {gpu})
        if adopted:
            logger.info("re-adopted lease of GPU %s by live process %d (%s)", gpu, lease.pid, lease.job)
        return adopted

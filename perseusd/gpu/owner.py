"""One owner thread per GPU: every call to a `GpuDevice` goes through its command queue, in order.

Setters equal to the current state are skipped (no device call); the owner knows the current state from its
own writes and from `read()` / `save_state()`, and performs a setter whenever it does not know. `restore()`
never skips. Every device call is timed; `stats()` gives per-operation counters and `healthy()` turns false
when a call runs longer than `call_timeout_s` (a hung driver), which the daemon uses to stop feeding the
systemd watchdog. Errors from the device reach the caller through the `Future` as typed exceptions.

Clock sets never queue behind each other (latest wins): a clock lock blocks its caller ~10 ms on an H100, so
a plan that asks for clocks faster than that would otherwise build a queue and apply every clock late. While
a clock set waits in the queue and nothing that changes the GPU's state (a reset, a power limit, a save or a
restore) was queued after it, a newer clock set replaces its target instead of queueing; the superseded
request's Future then gives the clock that was applied in its place (counted as `superseded`). Reads do not
break the slot: they change nothing, so a newer clock may overtake them. `clock_set_latency_s()` is the
recent median duration of the clock-set calls, what a clock change takes to act.

The counters and the call timing are `CallStats` (`perseusd.gpu.owner_stats`); a reading is a `GpuReading`
(`perseusd.gpu.reading`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from perseusd.errors import GpuError
from perseusd.gpu.backend import GpuDevice, GpuInfo, GpuState
from perseusd.gpu.clocks import clamp, snap_clock_mhz
from perseusd.gpu.errors import GpuOwnerStoppedError
from perseusd.gpu.owner_stats import SET_CLOCK, CallStats, latency_quantile_s
from perseusd.gpu.reading import GpuReading
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

T = TypeVar("T")
Locked = TypeVar("Locked", int, None)
"""What a clock write leaves locked: the clock it applied (a set) or None (a reset)."""
_UNKNOWN: Any = object()
_READS = frozenset({"read", "read_energy"})
"""Operations a newer clock set may overtake: they change nothing on the GPU."""


@dataclass
class _Command:
    op: str
    run: Callable[[], Any] | None
    """What the command does; None for a clock set (`GpuOwner._set_clock`: it reads the command's target when
    it runs, and a closure over the command would make a reference cycle, left to the garbage collector, for
    every clock set)."""
    future: Future[Any]
    target_mhz: int = 0
    """A clock set's clock, replaced by newer requests while the command waits (latest wins)."""
    followers: list[Future[Any]] = field(default_factory=list)
    """Futures of the clock sets this command superseded: they get its outcome."""


class GpuOwner:
    """The one thread that talks to one GPU."""

    def __init__(self, device: GpuDevice, call_timeout_s: float = 5.0) -> None:
        self._device = device
        self._info = device.info
        self._call_timeout_s = call_timeout_s
        self._queue: queue.SimpleQueue[_Command | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._calls = CallStats(self._lock)
        self._open_clock: _Command | None = None  # a queued clock set that newer ones may replace
        # The known state, touched only on the owner thread; _UNKNOWN until known.
        self._locked_mhz: int | None = _UNKNOWN
        self._power_limit_w: float = _UNKNOWN

    @property
    def info(self) -> GpuInfo:
        return self._info

    # Life cycle.

    def start(self) -> None:
        """Start the owner thread (commands submitted before are kept and run in order)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = NamedThread(target=self._loop, name=f"gpu-{self._info.index}", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Run the commands already queued, then stop the thread (waiting up to `timeout_s`)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._queue.put(None)
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("GPU %s owner thread did not stop in %.1f s", self._info.uuid, timeout_s)
        self._fail_pending()

    def healthy(self) -> bool:
        """The thread is alive and no device call has been running longer than `call_timeout_s`."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return False
        started_s = self._calls.call_started_s
        return started_s is None or time.monotonic() - started_s <= self._call_timeout_s

    def stats(self) -> dict[str, dict[str, float]]:
        """Per operation: calls, skipped, superseded, errors, total_s, max_s, last_s (a copy)."""
        return self._calls.snapshot()

    def clock_set_latencies_s(self) -> tuple[float, ...]:
        """The durations of the last `LATENCY_WINDOW` clock-set calls (s), oldest first."""
        return self._calls.clock_set_latencies_s()

    def clock_set_latency_s(self, quantile: float = 0.5) -> float | None:
        """The `quantile` of the durations of the last `LATENCY_WINDOW` clock-set calls (s; 0.5: the median,
        linear between samples); None before the first."""
        return latency_quantile_s(self.clock_set_latencies_s(), quantile)

    # Commands.

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> Future[int]:
        """Lock the SM clock (snapped to a supported clock); the Future gives the clock applied (MHz).

        Latest wins: a clock set still waiting in the queue takes this clock instead, and both Futures give
        the clock applied (see the module's docstring).
        """
        future: Future[int] = Future()
        with self._lock:
            if self._stopped:
                future.set_exception(
                    GpuOwnerStoppedError("GPU owner stopped", uuid=self._info.uuid, op=SET_CLOCK)
                )
                return future
            waiting = self._open_clock
            if waiting is not None:
                waiting.target_mhz = clock_mhz
                waiting.followers.append(future)
                self._calls.count_superseded()
                return future
            command = _Command(SET_CLOCK, None, future, target_mhz=clock_mhz)
            self._open_clock = command
            self._queue.put(command)
        return future

    def reset_locked_sm_clock(self) -> Future[None]:
        """Unlock the SM clock; skipped when known not to be locked."""
        return self._submit("reset_locked_sm_clock", self._do_reset_clock)

    def set_power_limit_w(self, limit_w: float) -> Future[float]:
        """Request a power limit (W); the Future gives the enforced limit (W)."""
        return self._submit("set_power_limit_w", lambda: self._do_set_power_limit(limit_w))

    def read(self) -> Future[GpuReading]:
        """Read the GPU; never fails: unavailable values are None and listed in `GpuReading.error`."""
        return self._submit("read", self._do_read)

    def read_energy(self) -> Future[tuple[int, int]]:
        """The energy counter (mJ) and when it was read: (CLOCK_MONOTONIC ns right after the read, mJ)."""
        return self._submit("read_energy", self._do_read_energy)

    def save_state(self) -> Future[GpuState]:
        """The controllable state, to restore later."""
        return self._submit("save_state", self._do_save_state)

    def restore(self, state: GpuState) -> Future[None]:
        """Reset or set the clock, then set the power limit, never skipping; fails with the first error."""
        return self._submit("restore", lambda: self._do_restore(state))

    # The owner thread.

    def _submit(self, op: str, run: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._stopped:
                future.set_exception(GpuOwnerStoppedError("GPU owner stopped", uuid=self._info.uuid, op=op))
                return future
            if op not in _READS:
                self._open_clock = None  # a later clock set must not overtake a state change
            self._queue.put(_Command(op, run, future))
        return future

    def _set_clock(self, command: _Command) -> int:
        """Owner thread: run the clock set `command` (at the clock it holds now: latest wins)."""
        return self._do_set_clock(self._take_target(command))

    def _take_target(self, command: _Command) -> int:
        """Owner thread: close `command`'s slot (newer requests queue after it) and give its clock."""
        with self._lock:
            if self._open_clock is command:
                self._open_clock = None
            return command.target_mhz

    def _loop(self) -> None:
        while True:
            command = self._queue.get()
            if command is None:
                return
            with self._lock:
                futures = [command.future, *command.followers]
            live = [future for future in futures if future.set_running_or_notify_cancel()]
            if not live:  # every request was cancelled, unless one superseded it until now
                self._take_target(command)
                with self._lock:
                    rest = [f for f in command.followers if f not in futures]
                live = [future for future in rest if future.set_running_or_notify_cancel()]
                if not live:
                    continue
            try:
                result = command.run() if command.run is not None else self._set_clock(command)
            except BaseException as error:
                if not isinstance(error, GpuError):
                    logger.exception("GPU %s: %s failed unexpectedly", self._info.uuid, command.op)
                self._settle(command, live, error=error)
            else:
                self._settle(command, live, result=result)

    def _settle(
        self,
        command: _Command,
        live: list[Future[Any]],
        result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        """Give every live Future of `command` its outcome, then those that superseded it while it ran."""
        with self._lock:
            late = [f for f in command.followers if f not in live]
        live += [future for future in late if future.set_running_or_notify_cancel()]
        for future in live:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _fail_pending(self) -> None:
        while True:
            try:
                command = self._queue.get_nowait()
            except queue.Empty:
                return
            if command is None:
                continue
            for future in [command.future, *command.followers]:
                if future.set_running_or_notify_cancel():
                    error = GpuOwnerStoppedError("GPU owner stopped", uuid=self._info.uuid, op=command.op)
                    future.set_exception(error)

    def _do_set_clock(self, clock_mhz: int) -> int:
        op = "set_locked_sm_clock_mhz"
        clocks = self._info.supported_sm_clocks_mhz
        if (
            clocks
            and self._locked_mhz is not _UNKNOWN
            and self._locked_mhz == snap_clock_mhz(clocks, clock_mhz)
        ):
            self._calls.skip(op)
            return int(self._locked_mhz)
        return self._write_clock(op, self._device.set_locked_sm_clock_mhz, clock_mhz)

    def _do_reset_clock(self) -> None:
        op = "reset_locked_sm_clock"
        if self._locked_mhz is None:
            self._calls.skip(op)
            return
        self._write_clock(op, self._device.reset_locked_sm_clock)

    def _do_set_power_limit(self, limit_w: float) -> float:
        op = "set_power_limit_w"
        info = self._info
        target_w = clamp(limit_w, info.power_limit_min_w, info.power_limit_max_w)
        if self._power_limit_w is not _UNKNOWN and round(self._power_limit_w * 1000) == round(
            target_w * 1000
        ):
            self._calls.skip(op)
            return float(self._power_limit_w)
        return self._write_power_limit(limit_w)

    def _write_clock(self, op: str, write: Callable[..., Locked], *args: Any) -> Locked:
        """One clock write (a set or a reset): the locked clock is unknown until it returns, so a write that
        failed, whatever it left, is never skipped as already done."""
        self._locked_mhz = _UNKNOWN
        locked_mhz = self._calls.call(op, write, *args)
        self._locked_mhz = locked_mhz
        return locked_mhz

    def _write_power_limit(self, limit_w: float) -> float:
        """One power-limit write: the limit is unknown until it returns (as for `_write_clock`)."""
        self._power_limit_w = _UNKNOWN
        enforced_w = self._calls.call("set_power_limit_w", self._device.set_power_limit_w, limit_w)
        self._power_limit_w = enforced_w
        return enforced_w

    def _do_read(self) -> GpuReading:
        errors: list[str] = []
        device = self._device

        def attempt(op: str, fn: Callable[[], T]) -> T | None:
            try:
                return self._calls.call(op, fn)
            except Exception as error:
                errors.append(f"{op}: {error}")
                return None

        locked_mhz = attempt("locked_sm_clock_mhz", device.locked_sm_clock_mhz)
        if not any(e.startswith("locked_sm_clock_mhz") for e in errors):
            self._locked_mhz = locked_mhz
        power_limit_w = attempt("power_limit_w", device.power_limit_w)
        if power_limit_w is not None:
            self._power_limit_w = power_limit_w
        energy_mj = attempt("energy_mj", device.energy_mj) if self._info.energy_counter_supported else None
        return GpuReading(
            uuid=self._info.uuid,
            sm_clock_mhz=attempt("sm_clock_mhz", device.sm_clock_mhz),
            locked_sm_clock_mhz=locked_mhz,
            power_w=attempt("power_w", device.power_w),
            power_limit_w=power_limit_w,
            energy_mj=energy_mj,
            clock_event_reasons=self._optional_reasons(),
            error="; ".join(errors) or None,
        )

    def _optional_reasons(self) -> int | None:
        """The clock-event reasons, or None where the GPU or driver has none (not an error of the reading)."""
        try:
            return self._calls.call("clock_event_reasons", self._device.clock_event_reasons)
        except Exception:
            return None

    def _do_read_energy(self) -> tuple[int, int]:
        energy_mj = self._calls.call("energy_mj", self._device.energy_mj)
        return time.monotonic_ns(), energy_mj

    def _do_save_state(self) -> GpuState:
        locked_mhz = self._calls.call("locked_sm_clock_mhz", self._device.locked_sm_clock_mhz)
        self._locked_mhz = locked_mhz
        power_limit_w = self._calls.call("power_limit_w", self._device.power_limit_w)
        self._power_limit_w = power_limit_w
        return GpuState(locked_sm_clock_mhz=locked_mhz, power_limit_w=power_limit_w)

    def _do_restore(self, state: GpuState) -> None:
        if state.locked_sm_clock_mhz is None:
            self._write_clock("reset_locked_sm_clock", self._device.reset_locked_sm_clock)
        else:
            self._write_clock(
                "set_locked_sm_clock_mhz", self._device.set_locked_sm_clock_mhz, state.locked_sm_clock_mhz
            )
        self._write_power_limit(state.power_limit_w)

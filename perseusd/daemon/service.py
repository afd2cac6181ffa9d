"""The daemon's life: startup -> main loop -> shutdown; signals in one place; systemd notifications."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from perseusd.daemon import sdnotify
from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.ipc import IpcServer

logger = logging.getLogger(__name__)

IDLE_POLL_S = 1.0
BUSY_POLL_S = 0.05
TICK_PERIOD_S = BUSY_POLL_S
"""While only events arrive, the main loop's periodic work (`DaemonCore.tick`: solves to collect, waiting
jobs, the power cap's sampling, a state write to retry) runs at most this often, not after every event: that
work is paced by the clock (with no event it waits up to `BUSY_POLL_S`, the same period), and a training
job's events would otherwise run it thousands of times a second. A deferred tick costs a wake-up of its own
when no event follows in time, so a shorter period than the idle pace only adds wake-ups on the cores
training uses. A request, a connection, a process death, a signal or a timeout is still followed by a tick
at once, and so is the first event after a quiet spell."""
MAX_LOOP_FAILURES = 20
"""Iterations in a row that may fail before the daemon gives up (restoring every GPU) and exits."""
EXIT_CRASHED = 1

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


@dataclass
class SignalState:
    """What the signal handlers asked for; read by the main loop."""

    stop: bool = False
    reload: bool = False
    previous: dict[int, _Handler] = field(default_factory=dict)
    wakeup_r: socket.socket | None = None
    wakeup_w: socket.socket | None = None
    previous_wakeup_fd: int = -1


def install_signal_handlers(state: SignalState) -> None:
    """SIGTERM/SIGINT stop, SIGHUP reloads; a wake-up socket makes the poll return at once."""
    state.wakeup_r, state.wakeup_w = socket.socketpair()
    state.wakeup_r.setblocking(False)
    state.wakeup_w.setblocking(False)
    state.previous_wakeup_fd = signal.set_wakeup_fd(state.wakeup_w.fileno(), warn_on_full_buffer=False)

    def on_stop(_signum: int, _frame: FrameType | None) -> None:
        state.stop = True

    def on_reload(_signum: int, _frame: FrameType | None) -> None:
        state.reload = True

    for signum, handler in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop), (signal.SIGHUP, on_reload)):
        state.previous[signum] = signal.signal(signum, handler)


def restore_signal_handlers(state: SignalState) -> None:
    for signum, handler in state.previous.items():
        signal.signal(signum, handler)
    state.previous.clear()
    signal.set_wakeup_fd(state.previous_wakeup_fd)
    for sock in (state.wakeup_r, state.wakeup_w):
        if sock is not None:
            sock.close()


def drain(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except BlockingIOError:
        pass


class Service:
    """Runs the main loop over a built core and IPC server until SIGTERM/SIGINT."""

    def __init__(
        self,
        config: DaemonConfig,
        core: DaemonCore,
        ipc: IpcServer,
        reload_config: Callable[[], DaemonConfig],
        apply_config: Callable[[DaemonConfig], None],
    ) -> None:
        self._config = config
        self._core = core
        self._ipc = ipc
        self._reload_config = reload_config
        self._apply_config = apply_config
        self._signals = SignalState()
        self._watchdog_s = sdnotify.watchdog_interval_s()
        self._next_ping_s = 0.0
        self._last_tick_s = -math.inf
        self._tick_skipped = False  # after events only, within TICK_PERIOD_S of the last tick
        self.loop_errors = 0

    def run(self) -> int:
        """Serve until asked to stop; restore every GPU on the way out, whatever ended the loop.

        Returns the exit code: 0 after SIGTERM/SIGINT, 1 when the loop died of an error (systemd restarts
        the unit; every GPU was restored first).
        """
        install_signal_handlers(self._signals)
        crashed = False
        try:
            assert self._signals.wakeup_r is not None
            wakeup = self._signals.wakeup_r
            self._ipc.add_fd(wakeup.fileno(), lambda: drain(wakeup))
            sdnotify.notify(f"READY=1\nSTATUS={self._status_line()}\nMAINPID={os.getpid()}")
            logger.info("perseusd ready: %s", self._status_line())
            self._loop()
        except BaseException:  # the last resort: whatever it is, restore every GPU before exiting
            logger.critical("main loop died: restoring every GPU before exiting", exc_info=True)
            crashed = True
        finally:
            restore_signal_handlers(self._signals)
        code = self.shutdown()
        return EXIT_CRASHED if crashed else code

    def _loop(self) -> None:
        poll_s = IDLE_POLL_S if self._watchdog_s is None else min(IDLE_POLL_S, self._watchdog_s / 4)
        failures = 0
        while not self._signals.stop:
            try:
                self._iterate(poll_s)
                failures = 0
            except Exception:  # one bad iteration never ends the daemon; a broken loop does
                failures += 1
                self.loop_errors += 1
                logger.exception("error in the main loop (%d in a row)", failures)
                if failures >= MAX_LOOP_FAILURES:
                    raise
                time.sleep(BUSY_POLL_S)

    def _iterate(self, poll_s: float) -> None:
        if self._tick_skipped:  # wake up for it in time (sooner than BUSY_POLL_S: no need to ask busy())
            timeout_s = max(0.0, min(poll_s, self._last_tick_s + TICK_PERIOD_S - time.monotonic()))
        else:
            timeout_s = BUSY_POLL_S if self._core.busy() else poll_s
        events_only = self._ipc.poll_once(math.ceil(timeout_s * 1000))
        now_s = time.monotonic()
        self._tick_skipped = events_only and now_s < self._last_tick_s + TICK_PERIOD_S
        if not self._tick_skipped:
            self._last_tick_s = now_s
            self._core.tick()
        if self._signals.reload:
            self._signals.reload = False
            self._reload()
        self._feed_watchdog()

    def _feed_watchdog(self) -> None:
        if self._watchdog_s is None:
            return
        now_s = time.monotonic()
        if now_s < self._next_ping_s:
            return
        if not self._core.registry.healthy():
            logger.error("a GPU owner thread is unhealthy: not feeding the watchdog")
            self._next_ping_s = now_s + self._watchdog_s / 2
            return
        sdnotify.notify("WATCHDOG=1")
        self._next_ping_s = now_s + self._watchdog_s / 2

    def _reload(self) -> None:
        sdnotify.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new_config = self._reload_config()
            self._apply_config(new_config)
            self._config = new_config
            logger.info("configuration reloaded")
        except Exception as exc:
            logger.error("reload failed, keeping the running configuration: %s", exc)
        sdnotify.notify(f"READY=1\nSTATUS={self._status_line()}")

    def shutdown(self) -> int:
        """Restore every GPU (one failing never stops the others), then release everything."""
        try:
            sdnotify.notify("STOPPING=1")
        except Exception:
            logger.exception("sd_notify STOPPING failed")
        outcome = self._core.shutdown()
        if outcome.failed:
            logger.error("shutdown: restore FAILED on %s (perseusd reset retries)", ", ".join(outcome.failed))
        logger.info("shutdown: restored %d GPU(s)", len(outcome.restored))
        return 0

    def _status_line(self) -> str:
        health = self._core.health()
        return (
            f"{len(self._core.registry.uuids)} GPU(s) ({self._config.backend}), "
            f"{health.clients} client(s), {health.events_received} events"
        )

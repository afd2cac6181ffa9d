"""The node's grid signal as the daemon uses it: the last good value, its forecast, and how fresh they are.

A `SignalPoller` thread fetches the source every `poll_s` and hands the result to the `SignalKeeper`, which
forecasts the next interval (off the daemon's main loop: training the regressor and importing scikit-learn
take time). A failed fetch keeps the last good value and forecast for `max_age_s` after the last success
(state `stale`); after that, or before any success, there is no usable value (state `expired` or `failed`)
and carbon-aware jobs run their policy's default point. Every change of state is logged once; status shows
the state, the value, its age and the last error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from perseusd.carbon.forecast import Forecast, forecast
from perseusd.carbon.sources import SignalSource
from perseusd.carbon.traces import SignalError, SignalPoint
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)
OK, STALE, EXPIRED, FAILED = "ok", "stale", "expired", "failed"


@dataclass(frozen=True)
class SignalStatus:
    """What status reports about the node's signal."""

    source: str
    unit: str
    state: str
    value: float | None
    """The value in use (None: none usable; carbon-aware jobs run their default point)."""
    forecast: float | None
    forecaster: str
    mape_pct: dict[str, float] = field(default_factory=dict)
    age_s: float | None = None
    """Seconds since the last successful fetch (None: never)."""
    error: str = ""
    reference: float | None = None
    """The highest value of the last day's history (Chase's reference intensity)."""


@dataclass(frozen=True)
class _Good:
    at_s: float
    value: float
    forecast: Forecast
    reference: float


class SignalKeeper:
    """Thread-safe: the poller thread updates, the main loop reads."""

    def __init__(
        self,
        source: str,
        unit: str,
        max_age_s: float,
        method: str = "auto",
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._unit = unit
        self._max_age_s = max_age_s
        self._method = method
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._good: _Good | None = None
        self._history: list[SignalPoint] = []
        self._error = ""
        self._logged_state = ""
        self._log_lock = threading.Lock()

    def update(self, history: list[SignalPoint]) -> None:
        """A successful fetch (oldest first, current last). The same history as the last fetch keeps its
        forecast (training the regressor again would give the same value)."""
        if not history:
            self.failed("the source returned no points")
            return
        with self._lock:
            same = self._good is not None and self._history == history
            if same and self._good is not None:
                self._good, self._error = replace(self._good, at_s=self._clock_s()), ""
        if same:
            self._log_state()
            return
        try:
            predicted = forecast(history, self._method)
        except (SignalError, ValueError) as exc:  # a forecaster failure falls back to the last value
            logger.warning("signal %s: forecast failed (%s): using the last value", self._source, exc)
            predicted = Forecast(history[-1].value, "persistence", {})
        day = [p.value for p in history if p.at_s > history[-1].at_s - 86400.0]
        good = _Good(self._clock_s(), history[-1].value, predicted, max(day))
        with self._lock:
            self._good, self._error, self._history = good, "", list(history)
        self._log_state()

    def failed(self, error: str) -> None:
        with self._lock:
            self._error = error
        self._log_state()

    def _state(self, now_s: float) -> str:
        if self._good is None:
            return FAILED if self._error else EXPIRED
        if now_s - self._good.at_s > self._max_age_s:
            return EXPIRED
        return STALE if self._error else OK

    def _log_state(self, current: SignalStatus | None = None) -> None:
        if current is None:
            current = self._current()
        with self._log_lock:
            if current.state == self._logged_state:
                return
            self._logged_state = current.state
        if current.state == OK:
            logger.info(
                "signal %s: %.1f %s (forecast %.1f)",
                self._source,
                current.value,
                self._unit,
                current.forecast,
            )
        elif current.state == STALE:
            logger.warning(
                "signal %s failing (%s): keeping the last value for up to %.0f s",
                self._source,
                current.error,
                self._max_age_s,
            )
        else:
            logger.warning(
                "signal %s %s (%s): carbon-aware jobs run their default point",
                self._source,
                current.state,
                current.error or "no value yet",
            )

    def status(self) -> SignalStatus:
        """The signal now. A state change is logged before it is returned, so that status never shows a state
        the log has not reported (a value can expire between two fetches)."""
        current = self._current()
        self._log_state(current)
        return current

    def _current(self) -> SignalStatus:
        now_s = self._clock_s()
        with self._lock:
            good, error = self._good, self._error
            state = self._state(now_s)
        usable = good is not None and state in (OK, STALE)
        return SignalStatus(
            source=self._source,
            unit=self._unit,
            state=state,
            value=good.value if usable and good else None,
            forecast=good.forecast.value if usable and good else None,
            forecaster=good.forecast.method if good else self._method,
            mape_pct=dict(good.forecast.mape_pct) if good else {},
            age_s=None if good is None else round(now_s - good.at_s, 1),
            error=error,
            reference=good.reference if usable and good else None,
        )

    def check(self) -> None:
        """From the main loop: log a value that expired without any fetch (a hung source)."""
        self._log_state()


class SignalPoller:
    """The thread that fetches the source every `poll_s` into the keeper."""

    def __init__(self, source: SignalSource, keeper: SignalKeeper, poll_s: float) -> None:
        self._source = source
        self._keeper = keeper
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        try:
            history = self._source.fetch()
        except SignalError as exc:
            self._keeper.failed(str(exc))
            return
        except Exception as exc:  # a broken source never stops the daemon
            self._keeper.failed(f"{type(exc).__name__}: {exc}")
            return
        self._keeper.update(history)

    def start(self) -> None:
        self._thread = NamedThread(target=self._run, name="perseusd-signal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self._poll_s)

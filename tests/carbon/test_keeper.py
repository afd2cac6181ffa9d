"""A failing source never hurts training: the last value is kept for a bounded time (stale), then there is
none (expired) and status and the log say so; a recovered source is used again."""

from __future__ import annotations

import logging
import time

import pytest

from perseusd.carbon.forecast import Forecast, forecast
from perseusd.carbon.keeper import EXPIRED, FAILED, OK, STALE, SignalKeeper, SignalPoller
from perseusd.carbon.traces import SignalError, SignalPoint


class Flaky:
    def __init__(self) -> None:
        self.fail: str | None = None
        self.points = [SignalPoint(1800.0 * i, 400.0 + i) for i in range(10)]

    def describe(self) -> str:
        return "flaky"

    def fetch(self) -> list[SignalPoint]:
        if self.fail == "signal":
            raise SignalError("the API said no")
        if self.fail == "bug":
            raise KeyError("surprise")
        return self.points


def test_stale_then_expired_then_recovered(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    keeper = SignalKeeper(
        "flaky", "gCO2eq/kWh", max_age_s=600.0, method="persistence", clock_s=lambda: now[0]
    )
    source = Flaky()
    poller = SignalPoller(source, keeper, poll_s=60.0)
    caplog.set_level(logging.INFO, logger="perseusd.carbon.keeper")
    assert keeper.status().state == EXPIRED
    assert keeper.status().value is None

    poller.poll_once()
    status = keeper.status()
    assert (status.state, status.value, status.forecast, status.reference) == (OK, 409.0, 409.0, 409.0)

    source.fail = "signal"
    now[0] = 300.0
    poller.poll_once()
    status = keeper.status()
    assert (status.state, status.value, status.error) == (STALE, 409.0, "the API said no")
    assert status.age_s == 300.0
    assert "keeping the last value for up to 600 s" in caplog.text

    now[0] = 601.0
    keeper.check()
    status = keeper.status()
    assert (status.state, status.value, status.forecast) == (EXPIRED, None, None)
    assert "carbon-aware jobs run their default point" in caplog.text

    source.fail = None
    poller.poll_once()
    assert keeper.status().state == OK
    assert keeper.status().error == ""


def test_a_source_that_never_worked_is_failed_and_a_bug_in_it_never_escapes() -> None:
    keeper = SignalKeeper("flaky", "gCO2eq/kWh", max_age_s=600.0)
    source = Flaky()
    source.fail = "bug"
    SignalPoller(source, keeper, poll_s=60.0).poll_once()
    status = keeper.status()
    assert (status.state, status.value) == (FAILED, None)
    assert "KeyError" in status.error


def test_the_poller_thread_starts_and_stops() -> None:
    keeper = SignalKeeper("flaky", "gCO2eq/kWh", max_age_s=600.0, method="persistence")
    poller = SignalPoller(Flaky(), keeper, poll_s=0.05)
    poller.start()
    try:
        for _ in range(200):
            if keeper.status().state == OK:
                break
            time.sleep(0.02)
    finally:
        poller.stop()
    assert keeper.status().state == OK


def test_an_unchanged_history_keeps_its_forecast_and_counts_as_a_fresh_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    keeper = SignalKeeper(
        "flaky", "gCO2eq/kWh", max_age_s=600.0, method="persistence", clock_s=lambda: now[0]
    )
    calls: list[int] = []

    def counting(history: list[SignalPoint], method: str) -> Forecast:
        calls.append(len(history))
        return forecast(history, method)

    monkeypatch.setattr("perseusd.carbon.keeper.forecast", counting)
    history = [SignalPoint(1800.0 * i, 400.0 + i) for i in range(10)]
    keeper.update(history)
    now[0] = 500.0
    keeper.update(list(history))  # the same points again: no new forecast, but the read is fresh
    assert calls == [10]
    assert keeper.status().age_s == 0.0
    assert keeper.status().forecast == 409.0
    keeper.update([*history, SignalPoint(18000.0, 500.0)])  # a new point: forecast again
    assert calls == [10, 11]
    assert keeper.status().forecast == 500.0


def test_status_never_shows_a_state_the_log_has_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    # A value expires between two fetches; whoever reads status first (the status request) sees it
    # expired, and the log must already say so, even if the next fetch recovers at once.
    now = [0.0]
    keeper = SignalKeeper("flaky", "gCO2eq/kWh", max_age_s=10.0, method="persistence", clock_s=lambda: now[0])
    source = Flaky()
    poller = SignalPoller(source, keeper, poll_s=60.0)
    caplog.set_level(logging.INFO, logger="perseusd.carbon.keeper")
    poller.poll_once()
    source.fail = "signal"
    poller.poll_once()
    now[0] = 11.0
    assert keeper.status().state == EXPIRED  # no fetch, no check(): only the status read saw it
    assert "carbon-aware jobs run their default point" in caplog.text
    source.fail = None
    poller.poll_once()
    assert keeper.status().state == OK
    assert caplog.text.count("carbon-aware jobs run their default point") == 1

"""Forecasts: persistence, Chase's SVR, their MAPE on the shared traces, and "auto" taking the better one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perseusd.carbon.forecast import backtest, forecast, persistence, svr
from perseusd.carbon.traces import SignalError, SignalPoint, load_trace

T0_S = 1_700_000_000.0 - (1_700_000_000.0 % 86400)


def daily_wave(days: int, step_s: float = 1800.0) -> list[SignalPoint]:
    """A clean daily cycle, 500 +- 150 by time of day: what time of day predicts and persistence lags."""
    count = int(days * 86400 / step_s)
    return [
        SignalPoint(T0_S + i * step_s, 500 + 150 * math.sin(2 * math.pi * (i * step_s % 86400) / 86400))
        for i in range(count)
    ]


def test_persistence_is_the_last_value() -> None:
    assert persistence(daily_wave(1)) == daily_wave(1)[-1].value
    with pytest.raises(SignalError):
        persistence([])


def test_the_svr_learns_the_time_of_day_and_beats_persistence_on_a_daily_cycle() -> None:
    history = daily_wave(3)
    svr_mape = backtest(history, "svr", 48)
    persistence_mape = backtest(history, "persistence", 48)
    assert svr_mape is not None
    assert persistence_mape is not None
    assert svr_mape < persistence_mape / 2
    chosen = forecast(history, "auto")
    assert chosen.method == "svr"
    assert chosen.mape_pct["svr"] < chosen.mape_pct["persistence"]


def test_with_too_little_history_the_svr_is_persistence() -> None:
    short = daily_wave(1)[:3]
    assert svr(short) == short[-1].value


def test_auto_keeps_persistence_where_it_is_better_on_the_chase_trace(reference_data: Path) -> None:
    trace = load_trace(reference_data / "carbon" / "chase_carbon_hist.csv")
    scores = {m: backtest(trace, m, 48) for m in ("persistence", "svr")}
    assert all(s is not None and 0 < s < 10 for s in scores.values())
    chosen = forecast(trace[:120], "auto")
    assert chosen.method == min(chosen.mape_pct, key=lambda m: chosen.mape_pct[m])


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(SignalError, match="forecaster must be one of"):
        forecast(daily_wave(1), "oracle")

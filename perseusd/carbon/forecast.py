"""The next interval's signal value: persistence (the last value) and Chase's support-vector regressor.

Chase's forecaster: an RBF support-vector regressor whose features are the time of day of the interval to
predict (as a point on the unit circle, so 23:30 is next to 00:00) and the previous interval's value, trained
on the previous day (every point of the last 24 h with its predecessor). Features and target are scaled by
the training day's mean and spread. scikit-learn is imported only when such a forecast is made (it is heavy;
never on the daemon's or perseusctl's import path).

`backtest` replays a history point by point (each forecast sees only the points before it) and gives each
method's mean absolute percentage error (MAPE); `forecast` uses the method with the lower backtest error on
the recent history ("auto", the default) or the one named.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.carbon.traces import SignalError, SignalPoint, median_step_s

METHODS = ("auto", "svr", "persistence")
DAY_S = 86400.0
SVR_C = 10.0
SVR_EPSILON = 0.05
BACKTEST_POINTS = 24
"""How many recent points `forecast("auto")` backtests both methods on."""


@dataclass(frozen=True)
class Forecast:
    """The predicted next value, the method that made it, and each method's recent backtest MAPE (%)."""

    value: float
    method: str
    mape_pct: dict[str, float]


def _time_features(at_s: float) -> tuple[float, float]:
    angle = 2 * math.pi * (at_s % DAY_S) / DAY_S
    return math.sin(angle), math.cos(angle)


def persistence(history: Sequence[SignalPoint]) -> float:
    """The last value."""
    if not history:
        raise SignalError("no history to forecast from")
    return history[-1].value


def svr(history: Sequence[SignalPoint], next_at_s: float | None = None) -> float:
    """Chase's forecast of the value at `next_at_s` (default: one interval after the last point), trained on
    the last day of `history`. With fewer than 4 training pairs it is persistence."""
    if not history:
        raise SignalError("no history to forecast from")
    step_s = median_step_s(history)
    target_at_s = history[-1].at_s + step_s if next_at_s is None else next_at_s
    day_from_s = history[-1].at_s - DAY_S
    pairs = [
        (b, a.value)
        for a, b in itertools.pairwise(history)
        if b.at_s > day_from_s and b.at_s - a.at_s <= 2 * step_s
    ]
    if len(pairs) < 4:
        return history[-1].value
    from sklearn.svm import SVR  # lazy: scikit-learn is heavy

    values = [b.value for b, _ in pairs]
    center = statistics.fmean(values)
    scale = statistics.pstdev(values) or max(abs(center), 1.0)
    features = [[*_time_features(b.at_s), (prev - center) / scale] for b, prev in pairs]
    targets = [(v - center) / scale for v in values]
    model = SVR(kernel="rbf", C=SVR_C, epsilon=SVR_EPSILON, gamma="scale")
    model.fit(features, targets)
    scaled = model.predict([[*_time_features(target_at_s), (history[-1].value - center) / scale]])
    return max(0.0, float(scaled[0]) * scale + center)


def predict(method: str, history: Sequence[SignalPoint]) -> float:
    if method == "svr":
        return svr(history)
    if method == "persistence":
        return persistence(history)
    raise SignalError(f"forecaster must be one of svr, persistence (got {method!r})")


def backtest(history: Sequence[SignalPoint], method: str, first: int) -> float | None:
    """MAPE (%) of `method` forecasting every point from index `first` on, each from the points before it
    (None when there is nothing to score)."""
    errors = []
    for index in range(max(1, first), len(history)):
        actual = history[index].value
        if actual <= 0:
            continue
        errors.append(abs(predict(method, history[:index]) - actual) / actual)
    return 100.0 * statistics.fmean(errors) if errors else None


def forecast(history: Sequence[SignalPoint], method: str = "auto") -> Forecast:
    """The next value by `method`; "auto" takes the method with the lower MAPE on the last
    `BACKTEST_POINTS` points (persistence while neither can be scored, or on a tie)."""
    if method not in METHODS:
        raise SignalError(f"forecaster must be one of {', '.join(METHODS)} (got {method!r})")
    if method != "auto":
        return Forecast(predict(method, history), method, {})
    first = len(history) - BACKTEST_POINTS
    scores = {m: backtest(history, m, first) for m in ("persistence", "svr")}
    mape = {m: s for m, s in scores.items() if s is not None}
    best = "svr" if "svr" in mape and mape["svr"] < mape.get("persistence", math.inf) else "persistence"
    return Forecast(predict(best, history), best, mape)

"""The least-squares fit of c(q) = a exp(b q) + c0 without a general-purpose optimiser.

For a fixed exponent b the model is linear in a and c0, so their best values are closed-form and the mean
squared error of the best fit with exponent b is n var(y) (1 - r(b)^2), where r(b) is the correlation between
exp(b q) and the costs. The reference (a grid of 54 Levenberg-Marquardt starts, `cost_model.py`) keeps the
lowest-error stationary point with a >= 0; a >= 0 is r(b) > 0. So the best fit is the highest local maximum of
r over b: found by scanning a grid of exponents and solving dr/db = 0 inside every bracket (regula falsi), to
full floating-point precision.

No numpy: an option set has tens of points, so importing numpy would cost more than the fit itself. The
moments at the 192 grid exponents are the inner loop; they run in C (`_fitcore`, the same bits) when it was
built, else in Python (`_moments`, its executable specification).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import mul
from typing import Any

MIN_POINTS = 4
"""Three parameters need more than three points: the reference rejects an exact fit (infinite covariance)."""
_HALF_GRID = 96
SPAN_EXPONENTS: tuple[float, ...] = tuple(
    [-80.0 * (1e-3 / 80.0) ** (i / (_HALF_GRID - 1)) for i in range(_HALF_GRID)]
    + [1e-3 * (80.0 / 1e-3) ** (i / (_HALF_GRID - 1)) for i in range(_HALF_GRID)]
)
"""The scanned b * (q_max - q_min), geometric on each side of zero: from nearly linear to a single kink."""
MAX_REFINE_STEPS = 200

Coefficients = tuple[float, float, float]


def _dot(x: Sequence[float], y: Sequence[float]) -> float:
    return float(sum(map(mul, x, y)))


def _centred(x: Sequence[float]) -> list[float]:
    mean = sum(x) / len(x)
    return [v - mean for v in x]


def _exps(u: Sequence[float], s: float) -> list[float]:
    """exp(s u), shifted by exp(-s) for s > 0 so that no value overflows (u in [0, 1])."""
    exp = math.exp
    if s > 0:
        return [exp(s * (v - 1.0)) for v in u]
    return [exp(s * v) for v in u]


def _moments(u: Sequence[float], y_c: Sequence[float], s: float) -> tuple[float, float, float]:
    """cov(e, y), var(e) and the numerator of dr/ds at span exponent `s` (e = exp(s u), y_c centred)."""
    e = _exps(u, s)
    e_c = _centred(e)
    de_c = _centred(list(map(mul, u, e)))
    cov_ey = _dot(e_c, y_c)
    var_e = _dot(e_c, e_c)
    # d/ds [cov(e,y) / sqrt(var(e))] has the sign of cov(e',y) var(e) - cov(e,y) cov(e,e').
    slope = _dot(de_c, y_c) * var_e - cov_ey * _dot(de_c, e_c)
    return cov_ey, var_e, slope


def _load_c_moments() -> Any | None:
    try:
        from perseusd.planner import _fitcore  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _fitcore.moments


_C_MOMENTS = _load_c_moments()


def moments_at(
    u: Sequence[float], y_c: Sequence[float], spans: Sequence[float], use_c: bool = True
) -> list[tuple[float, float, float]]:
    """`_moments` at every span exponent of `spans`, in C when it was built (and `use_c`)."""
    if use_c and _C_MOMENTS is not None:
        result: list[tuple[float, float, float]] = _C_MOMENTS(u, y_c, spans)
        return result
    return [_moments(u, y_c, s) for s in spans]


def _refine(
    u: Sequence[float], y_c: Sequence[float], lo: float, hi: float, f_lo: float, f_hi: float
) -> float:
    """The root of dr/ds in [lo, hi], where the slope is positive at lo and not positive at hi.

    Regula falsi with the Illinois correction, falling back to bisection, until the bracket cannot shrink.
    """
    side = 0
    for _ in range(MAX_REFINE_STEPS):
        if f_hi == 0.0:
            return hi
        if hi - lo <= 4e-16 * (abs(lo) + abs(hi)):
            break
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        if not lo < mid < hi:
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
        f_mid = moments_at(u, y_c, (mid,))[0][2]
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            f_hi = f_hi * 0.5 if side == 1 else f_hi
            side = 1
        else:
            hi, f_hi = mid, f_mid
            f_lo = f_lo * 0.5 if side == -1 else f_lo
            side = -1
    return 0.5 * (lo + hi)


def _best_span_exponent(u: Sequence[float], y_c: Sequence[float]) -> float | None:
    """The span exponent of the highest local maximum of r with r > 0, or None."""
    grid = moments_at(u, y_c, SPAN_EXPONENTS)
    best: tuple[float, float] | None = None
    for i in range(len(SPAN_EXPONENTS) - 1):
        s_lo, s_hi = SPAN_EXPONENTS[i], SPAN_EXPONENTS[i + 1]
        (cov_lo, _, slope_lo), (cov_hi, _, slope_hi) = grid[i], grid[i + 1]
        # r > 0 is cov(e, y) > 0 (var(e) > 0 away from s = 0, which the grid skips).
        if s_lo < 0 < s_hi or not (slope_lo > 0 >= slope_hi) or max(cov_lo, cov_hi) <= 0:
            continue
        s = _refine(u, y_c, s_lo, s_hi, slope_lo, slope_hi)
        cov_ey, var_e, _ = moments_at(u, y_c, (s,))[0]
        if cov_ey <= 0 or not var_e > 0:
            continue
        score = cov_ey * cov_ey / var_e
        if best is None or score > best[1]:
            best = (s, score)
    return None if best is None else best[0]


def fit_exponential(q: Sequence[float], y: Sequence[float]) -> tuple[Coefficients, float] | None:
    """The best (a, b, c0) with a > 0 and its mean squared error; None when no stationary fit has a > 0."""
    q, y = [float(v) for v in q], [float(v) for v in y]
    if len(q) < MIN_POINTS or len(q) != len(y) or not all(map(math.isfinite, q + y)):
        return None
    q_min, q_max = min(q), max(q)
    span = q_max - q_min
    if span <= 0 or max(y) == min(y):
        return None
    u = [(v - q_min) / span for v in q]
    y_c = _centred(y)
    s = _best_span_exponent(u, y_c)
    if s is None:
        return None
    e = _exps(u, s)
    cov_ey, var_e, _ = moments_at(u, y_c, (s,))[0]
    a_scaled = cov_ey / var_e
    c0 = sum(y) / len(y) - a_scaled * (sum(e) / len(e))
    b = s / span
    # e = exp(b (q - q_ref)), q_ref the slowest (s > 0) or fastest (s < 0) time: a = a_scaled exp(-b q_ref).
    try:
        a = a_scaled * math.exp(-b * (q_max if s > 0 else q_min))
        mse = sum((yi - (a * math.exp(b * qi) + c0)) ** 2 for qi, yi in zip(q, y, strict=True)) / len(q)
    except OverflowError:
        return None
    if not all(map(math.isfinite, (a, b, c0, mse))):
        return None
    return (a, b, c0), mse

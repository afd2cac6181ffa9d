"""The least-squares fit of c(q) = a exp(b q) + c0 (a > 0) without a general-purpose optimiser.

For a fixed exponent the model is linear in its other two coefficients, so their best values are closed-form
and the mean squared error of the best fit is var(y) (1 - G^2), G the correlation between the model's shape
and the costs. Written with the span exponent s = b (q_max - q_min) and u = (q - q_min) / span in [0, 1], the
shape is phi_s(u) = expm1(s (u - u0)) / s (u0 = 1 for s > 0, else 0): an exponential up to an affine map, so
it has the same correlation, and it tends to u as s -> 0. a > 0 is "the fitted multiple of phi_s has the sign
of s", so G(s) = sign(s) corr(phi_s, y) must be positive. The fit maximises G over the whole family the
reference (`cost_model.py`'s 54 `curve_fit` starts) can return:

- interior optima: a grid of |s| on each side of zero, and dG/d|s| = 0 solved inside every bracket where it
  changes sign (regula falsi), to full floating-point precision;
- the nearly-linear limit s -> 0 (the exponent towards 0 with a and c0 growing without bound: a straight
  line, approached from the side where a > 0), where the reference stops somewhere along the way; taken as
  an exponential with an exponent small enough that its error is the line's to 1e-12;
- the steepest exponent whose a exp(b q) the reference can still evaluate (b q_max or -b q_min at most
  log(max float)): beyond it its error is infinite.

Costs are evaluated in the stable form `level + slope expm1(b (q - q_ref)) / b` (q_ref the slowest time for
b > 0, the fastest for b < 0), which stays exact as b -> 0, where a exp(b q) + c0 cancels.

The moments at the grid exponents are the inner loop: numpy computes them for every exponent of the grid at
once (a matrix of exponents by points).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul

import numpy as np

MIN_POINTS = 4
"""Three parameters need more than three points: the reference rejects an exact fit (infinite covariance)."""
LOG_MAX_FLOAT = 709.782712893384
"""log of the largest float: exp of anything above it overflows, and the reference's error is then inf."""
SPAN_CAP = 1e5
"""The largest |s| searched when the times do not bound it (a time at or below zero)."""
GRID_MIN = 1e-3
GRID_RATIO = 1.1
GRID: tuple[float, ...] = tuple(
    GRID_MIN * GRID_RATIO**i for i in range(int(math.log(SPAN_CAP / GRID_MIN, 1.1)))
)
"""The scanned |s| (with 0 and the side's largest |s|): geometric, from nearly linear to a single kink."""
PSI_TERMS: tuple[float, ...] = tuple((j + 1) / math.factorial(j + 2) for j in range(18))
"""The series of psi(x) = (x e^x - expm1(x)) / x^2 (= d phi / d s / v^2), used for |x| < `SERIES_BELOW`."""
SERIES_BELOW = 0.5
MAX_REFINE_STEPS = 200
LINEAR_SLACK = 1e-12
"""The nearly-linear limit's exponent is taken where its error exceeds the line's by at most this share."""

Coefficients = tuple[float, float, float]


@dataclass(frozen=True)
class ExpFit:
    """A fitted c(q) = a exp(b q) + c0 with a >= 0, held in the stable form
    `level + slope * expm1(b (q - q_ref)) / b` (the cost and its derivative at `q_ref`)."""

    b: float
    q_ref: float
    level: float
    slope: float
    mse: float
    """The mean squared error over the fitted points."""

    def cost(self, q: float) -> float:
        """The modelled cost at `q`."""
        x = self.b * (q - self.q_ref)
        return self.level + self.slope * (math.expm1(x) / self.b if self.b != 0.0 else q - self.q_ref)

    @property
    def coefficients(self) -> Coefficients:
        """(a, b, c0); a and c0 grow without bound towards the nearly-linear limit (and may then overflow)."""
        try:
            a = self.slope / self.b * math.exp(-self.b * self.q_ref)
        except (OverflowError, ZeroDivisionError):
            a = math.inf
        c0 = self.level - self.slope / self.b if self.b != 0.0 else -math.inf
        return a, self.b, c0


def _dot(x: Sequence[float], y: Sequence[float]) -> float:
    return float(sum(map(mul, x, y)))


def _centred(x: Sequence[float]) -> list[float]:
    mean = sum(x) / len(x)
    return [v - mean for v in x]


def _psi(x: np.ndarray) -> np.ndarray:
    """(x e^x - expm1(x)) / x^2 for x <= 0, exact near 0 (its Taylor series there)."""
    series = np.polyval(PSI_TERMS[::-1], x)
    with np.errstate(divide="ignore", invalid="ignore"):
        closed = (x * np.exp(x) - np.expm1(x)) / (x * x)
    return np.where(x > -SERIES_BELOW, series, closed)


def _shapes(u: Sequence[float], spans: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """phi_s(u) and d phi_s / d s, a row per span exponent s, a column per point (every exponent
    s (u - u0) <= 0: nothing overflows)."""
    s = np.asarray(spans, dtype=float)[:, None]
    v = np.asarray(u, dtype=float)[None, :] - np.where(s > 0, 1.0, 0.0)
    x = s * v
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where(s != 0.0, np.expm1(x) / s, v)
    return phi, v * v * _psi(x)


def _shape(u: Sequence[float], s: float) -> list[float]:
    """phi_s(u) at every point."""
    phi: list[float] = _shapes(u, (s,))[0][0].tolist()
    return phi


def moments_at(
    u: Sequence[float], y_c: Sequence[float], spans: Sequence[float]
) -> list[tuple[float, float, float]]:
    """cov(phi, y), var(phi) and the numerator of d corr(phi, y) / ds at every span exponent of `spans`
    (`y_c` centred)."""
    if not spans:
        return []
    phi, dphi = _shapes(u, spans)
    e_c = phi - phi.mean(axis=1, keepdims=True)
    de_c = dphi - dphi.mean(axis=1, keepdims=True)
    y = np.asarray(y_c, dtype=float)
    # Row by row (einsum, not BLAS): an exponent's moments are the same bits whatever else is in the batch.
    cov_ey = np.einsum("ij,j->i", e_c, y)
    var_e = np.einsum("ij,ij->i", e_c, e_c)
    # d/ds [cov(phi,y) / sqrt(var(phi))] has the sign of cov(phi',y) var(phi) - cov(phi,y) cov(phi,phi').
    slope = np.einsum("ij,j->i", de_c, y) * var_e - cov_ey * np.einsum("ij,ij->i", de_c, e_c)
    return list(zip(cov_ey.tolist(), var_e.tolist(), slope.tolist(), strict=True))


def _refine(u: Sequence[float], y_c: Sequence[float], side: float, lo: float, hi: float) -> float:
    """The root of d corr / ds at s = side * t, t in [lo, hi], where the slope is positive at lo and not
    positive at hi (G = side * corr grows with t = |s| where the slope is positive, on either side).

    Regula falsi with the Illinois correction, falling back to bisection, until the bracket cannot shrink.
    """
    f_lo, f_hi = (m[2] for m in moments_at(u, y_c, (side * lo, side * hi)))
    end = 0
    for _ in range(MAX_REFINE_STEPS):
        if f_hi == 0.0:
            return hi
        if hi - lo <= 4e-16 * (abs(lo) + abs(hi)):
            break
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo) if f_hi != f_lo else lo
        if not lo < mid < hi:
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
        f_mid = moments_at(u, y_c, (side * mid,))[0][2]
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            f_hi = f_hi * 0.5 if end == 1 else f_hi
            end = 1
        else:
            hi, f_hi = mid, f_mid
            f_lo = f_lo * 0.5 if end == -1 else f_lo
            end = -1
    return 0.5 * (lo + hi)


def _score(moments: tuple[float, float, float], side: float) -> float | None:
    """G^2 var(y) n (the error it removes) where G = side * corr > 0 (a > 0); else None."""
    cov_ey, var_e, _ = moments
    if not (cov_ey * side > 0 and var_e > 0):
        return None
    return cov_ey * cov_ey / var_e


def _side_best(u: Sequence[float], y_c: Sequence[float], side: float, t_max: float) -> tuple[float, float]:
    """The best t = |s| on one side of zero and its score (t = 0: the nearly-linear limit; score 0: none)."""
    ts = [0.0, *(t for t in GRID if t < t_max), t_max]
    grid = moments_at(u, y_c, [side * t for t in ts])
    candidates = list(zip(ts, grid, strict=True))
    for k in range(len(ts) - 1):
        if grid[k][2] > 0 >= grid[k + 1][2]:
            t = _refine(u, y_c, side, ts[k], ts[k + 1])
            candidates.append((t, moments_at(u, y_c, (side * t,))[0]))
    best = (0.0, 0.0)
    for t, moments in candidates:
        score = _score(moments, side)
        if score is not None and score > best[1]:
            best = (t, score)
    return best


def _largest_spans(q_min: float, q_max: float, span: float, y_range: float) -> tuple[float, float]:
    """The largest |s| on each side (s > 0, s < 0) whose a exp(b q) the reference can still evaluate: for
    b > 0, exp(b q_max) finite; for b < 0, a = amplitude exp(-b q_min) finite."""
    positive = LOG_MAX_FLOAT / q_max * span if q_max > 0 else SPAN_CAP
    negative = (LOG_MAX_FLOAT - math.log(max(1.0, y_range))) / q_min * span if q_min > 0 else SPAN_CAP
    return min(positive, SPAN_CAP), min(negative, SPAN_CAP)


def _fit_at(q: Sequence[float], y: Sequence[float], u: Sequence[float], s: float, span: float) -> ExpFit:
    """The least-squares fit with span exponent `s` (0: the straight line)."""
    phi = _shape(u, s)
    e_c = _centred(phi)
    beta = _dot(e_c, _centred(y)) / _dot(e_c, e_c)
    q_ref = max(q) if s > 0 else min(q)  # where phi is 0
    level = sum(y) / len(y) - beta * (sum(phi) / len(phi))
    fit = ExpFit(s / span, q_ref, level, beta / span, 0.0)
    mse = sum((yi - fit.cost(qi)) ** 2 for qi, yi in zip(q, y, strict=True)) / len(q)
    return ExpFit(fit.b, q_ref, level, fit.slope, mse)


def _near_linear(
    q: Sequence[float], y: Sequence[float], u: Sequence[float], side: float, span: float
) -> ExpFit:
    """An exponential on `side` of zero whose error is the straight line's to `LINEAR_SLACK`."""
    line = _fit_at(q, y, u, 0.0, span)
    floor = (4 * 2.2e-16 * max(map(abs, y))) ** 2
    t = 1e-6
    while True:
        fit = _fit_at(q, y, u, side * t, span)
        if fit.mse <= line.mse * (1 + LINEAR_SLACK) + floor or t < 1e-290:
            return fit
        t /= 16


def fit_exponential(q: Sequence[float], y: Sequence[float]) -> ExpFit | None:
    """The least-squares c(q) = a exp(b q) + c0 with a >= 0 over the family the reference can return (a = 0,
    a constant, only where no a > 0 does better: equal costs); None when there is none (fewer than
    `MIN_POINTS` points, non-finite values, equal times)."""
    q, y = [float(v) for v in q], [float(v) for v in y]
    if len(q) < MIN_POINTS or len(q) != len(y) or not all(map(math.isfinite, q + y)):
        return None
    q_min, q_max = min(q), max(q)
    span = q_max - q_min
    if span <= 0:
        return None
    u = [(v - q_min) / span for v in q]
    y_c = _centred(y)
    t_pos, t_neg = _largest_spans(q_min, q_max, span, max(y) - min(y))
    (t_p, score_p), (t_n, score_n) = _side_best(u, y_c, 1.0, t_pos), _side_best(u, y_c, -1.0, t_neg)
    if max(score_p, score_n) <= 0:
        return _constant(q, y, span)
    side, t = (1.0, t_p) if score_p >= score_n else (-1.0, t_n)
    fit = _near_linear(q, y, u, side, span) if t == 0.0 else _fit_at(q, y, u, side * t, span)
    if not all(map(math.isfinite, (fit.b, fit.level, fit.slope, fit.mse))) or fit.slope / fit.b <= 0:
        return None
    return fit


def _constant(q: Sequence[float], y: Sequence[float], span: float) -> ExpFit:
    """a = 0: the mean cost (the exponent is immaterial; the reference's starts have b < 0)."""
    level = sum(y) / len(y)
    mse = sum((v - level) ** 2 for v in y) / len(y)
    return ExpFit(-1.0 / span, min(q), level, 0.0, mse)

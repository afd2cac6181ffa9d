"""The least-squares fit of c(q) = a exp(b q) + c0 without a general-purpose optimiser.

For a fixed exponent b the model is linear in a and c0, so their best values are closed-form and the mean
squared error of the best fit with exponent b is n var(y) (1 - r(b)^2), where r(b) is the correlation between
exp(b q) and the costs. The reference (a grid of 54 Levenberg-Marquardt starts, `cost_model.py`) keeps the
lowest-error stationary point with a >= 0; a >= 0 is r(b) > 0. So the best fit is the highest local maximum of
r over b: found by scanning a grid of exponents and solving dr/db = 0 inside every bracket (regula falsi), to
full floating-point precision. Only numpy is needed.
"""

from __future__ import annotations

import math

import numpy as np

MIN_POINTS = 4
"""Three parameters need more than three points: the reference rejects an exact fit (infinite covariance)."""
SPAN_EXPONENTS = np.concatenate([-np.geomspace(80.0, 1e-3, 96), np.geomspace(1e-3, 80.0, 96)])
"""The scanned b * (q_max - q_min): from nearly linear to a single kink."""
MAX_REFINE_STEPS = 200


def _moments(u: np.ndarray, y: np.ndarray, s: float) -> tuple[float, float, float]:
    """cov(e, y), var(e) and the numerator of dr/ds at span exponent `s` (e = exp(s u), u in [0, 1])."""
    e = np.exp(s * (u - 1.0)) if s > 0 else np.exp(s * u)
    de = u * e
    e_c = e - e.mean()
    y_c = y - y.mean()
    cov_ey = float(e_c @ y_c)
    var_e = float(e_c @ e_c)
    # d/ds [cov(e,y) / sqrt(var(e))] has the sign of cov(e',y) var(e) - cov(e,y) cov(e,e').
    slope = float((de - de.mean()) @ y_c) * var_e - cov_ey * float((de - de.mean()) @ e_c)
    return cov_ey, var_e, slope


def _correlations(u: np.ndarray, y: np.ndarray, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """r(s) and the sign of dr/ds on a grid of span exponents, vectorised."""
    shifted = np.where(spans[:, None] > 0, u[None, :] - 1.0, u[None, :])
    e = np.exp(spans[:, None] * shifted)
    de = u[None, :] * e
    e_c = e - e.mean(axis=1, keepdims=True)
    de_c = de - de.mean(axis=1, keepdims=True)
    y_c = y - y.mean()
    cov_ey = e_c @ y_c
    var_e = np.einsum("ij,ij->i", e_c, e_c)
    with np.errstate(all="ignore"):
        r = cov_ey / np.sqrt(var_e * float(y_c @ y_c))
    slope = (de_c @ y_c) * var_e - cov_ey * np.einsum("ij,ij->i", de_c, e_c)
    return np.nan_to_num(r, nan=-np.inf), slope


def _refine(u: np.ndarray, y: np.ndarray, lo: float, hi: float, f_lo: float, f_hi: float) -> float:
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
        f_mid = _moments(u, y, mid)[2]
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            f_hi = f_hi * 0.5 if side == 1 else f_hi
            side = 1
        else:
            hi, f_hi = mid, f_mid
            f_lo = f_lo * 0.5 if side == -1 else f_lo
            side = -1
    return 0.5 * (lo + hi)


def _coefficients(u: np.ndarray, y: np.ndarray, s: float, q_ref: float, span: float) -> tuple[float, ...]:
    cov_ey, var_e, _ = _moments(u, y, s)
    e = np.exp(s * (u - 1.0)) if s > 0 else np.exp(s * u)
    a_scaled = cov_ey / var_e
    c0 = float(y.mean() - a_scaled * e.mean())
    b = s / span
    # e = exp(b (q - q_ref)), q_ref the fastest (s < 0) or slowest (s > 0) time: a = a_scaled exp(-b q_ref).
    return a_scaled * math.exp(-b * q_ref), b, c0


def fit_exponential(q: np.ndarray, y: np.ndarray) -> tuple[tuple[float, float, float], float] | None:
    """The best (a, b, c0) with a > 0 and its mean squared error; None when no stationary fit has a > 0."""
    q = np.asarray(q, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if q.size < MIN_POINTS or not (np.all(np.isfinite(q)) and np.all(np.isfinite(y))):
        return None
    q_min, q_max = float(q.min()), float(q.max())
    span = q_max - q_min
    if span <= 0 or float(np.ptp(y)) == 0.0:
        return None
    u = (q - q_min) / span
    r, slope = _correlations(u, y, SPAN_EXPONENTS)
    best: tuple[float, float] | None = None
    for i in range(len(SPAN_EXPONENTS) - 1):
        s_lo, s_hi = float(SPAN_EXPONENTS[i]), float(SPAN_EXPONENTS[i + 1])
        if s_lo < 0 < s_hi or not (slope[i] > 0 >= slope[i + 1]):
            continue
        if max(r[i], r[i + 1]) <= 0:
            continue
        s = _refine(u, y, s_lo, s_hi, float(slope[i]), float(slope[i + 1]))
        cov_ey, var_e, _ = _moments(u, y, s)
        if cov_ey <= 0:
            continue
        score = cov_ey * cov_ey / var_e
        if best is None or score > best[1]:
            best = (s, score)
    if best is None:
        return None
    s = best[0]
    coefficients = _coefficients(u, y, s, q_max if s > 0 else q_min, span)
    a, b, c0 = coefficients
    if not all(math.isfinite(v) for v in coefficients):
        return None
    with np.errstate(all="ignore"):
        mse = float(np.mean(np.square(y - (a * np.exp(b * q) + c0))))
    if not math.isfinite(mse):
        return None
    return (a, b, c0), mse

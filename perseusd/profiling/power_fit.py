"""The power fit of online profiling: window energies explained by each (key, clock) group's power.

Weighted least squares over the counter windows (non-negative when it must be), windows with outlying
residuals (beyond 3.5 scaled MADs) dropped and the fit repeated, standard errors from the residual variance
and the normal matrix, then a weak prior that groups at one clock draw similar power
(`with_same_clock_prior`). `estimator` builds the windows and their overlaps; this module solves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MAD_TO_SIGMA = 1.4826
OUTLIER_MADS = 3.5
_MIN_RESIDUAL_SCALE = 1e-4
"""Window outliers: the residual scale never goes below this (noise-free counters fit exactly)."""
_MAX_REFITS = 3
_RANK_TOLERANCE = 1e-12
"""Eigenvalues of the normal matrix below this fraction of the largest count as zero."""
_NULL_TOLERANCE = 1e-6
"""A coefficient with a null-space component above this is not determined by the windows."""
_SAME_CLOCK_POWER_SPREAD = 0.15
"""Prior: two groups at one clock on one GPU draw powers within about this fraction of their mean of each
other (one standard deviation). The measured H100 GPT stages' forward and backward differ by 0-14 %."""


@dataclass(frozen=True)
class Fit:
    powers_w: FloatArray
    errors_w: FloatArray
    """Standard errors; inf when unknown (no more windows than coefficients)."""
    determined: npt.NDArray[np.bool_]
    """False where the windows only tell a coefficient's combination with others (collinear columns)."""
    rows: npt.NDArray[np.bool_]
    """The windows used."""

    @property
    def windows(self) -> int:
        return int(self.rows.sum())


def with_same_clock_prior(
    fit: Fit, design: FloatArray, target_j: FloatArray, scale: FloatArray, clocks_mhz: list[int]
) -> Fit:
    """`fit` refitted with a weak prior that groups at one clock draw similar power (MAP estimate).

    Computations that always run next to each other in the same proportion (the last 1F1B stage's forward
    and backward) are told apart only by where the counter's window edges fall, so their split is noisy even
    when their sum is exact: a few milliseconds of timing noise moved the LM-head stage's forward energy by
    30-50 %. The prior adds, per pair of the fit's groups at one clock, the pseudo-observation that their
    powers differ by 0 with a standard deviation of `_SAME_CLOCK_POWER_SPREAD` of their mean (from the first
    fit), weighed against the windows by the fit's own residual variance. Windows that separate the pair
    outweigh it (a well-determined split moves by a small fraction of its standard error); a poorly
    determined one is pulled towards the pair's common power, and its standard error is bounded by the
    prior's. Coefficients the windows do not determine at all stay undetermined (no estimate)."""
    pairs = [
        (i, j)
        for i in range(len(clocks_mhz))
        for j in range(i + 1, len(clocks_mhz))
        if clocks_mhz[i] == clocks_mhz[j] and fit.determined[i] and fit.determined[j]
    ]
    count, columns = fit.windows, design.shape[1]
    if not pairs or count <= columns:
        return fit
    weighted = design[fit.rows] * scale[fit.rows, None]
    weighted_target = target_j[fit.rows] * scale[fit.rows]
    residuals = weighted_target - weighted @ fit.powers_w
    sigma = math.sqrt(max(float(residuals @ residuals) / (count - columns), _MIN_RESIDUAL_SCALE**2))
    prior = np.zeros((len(pairs), columns))
    for row, (i, j) in enumerate(pairs):
        mean_w = (fit.powers_w[i] + fit.powers_w[j]) / 2.0
        if mean_w <= 0:
            return fit
        prior[row, i], prior[row, j] = 1.0, -1.0
        prior[row] *= sigma / (_SAME_CLOCK_POWER_SPREAD * mean_w)
    augmented = np.vstack((weighted, prior))
    inverse, _ = _normal_pseudo_inverse(augmented)
    powers = inverse @ (augmented.T @ np.concatenate((weighted_target, np.zeros(len(pairs)))))
    if np.any(powers < 0):
        return fit
    errors = np.where(fit.determined, np.sqrt(np.maximum(np.diag(inverse), 0.0)) * sigma, math.inf)
    return Fit(powers, errors, fit.determined, fit.rows)


def robust_fit(design: FloatArray, target_j: FloatArray, scale: FloatArray) -> Fit | None:
    """Weighted least squares; windows with residuals beyond 3.5 scaled MADs are dropped and it refits."""
    rows = np.ones(target_j.size, dtype=bool)
    for _ in range(_MAX_REFITS):
        fitted = _fit_rows(design, target_j, scale, rows)
        if fitted is None or np.array_equal(fitted[1], rows):
            return None if fitted is None else fitted[0]
        rows = fitted[1]
    fitted = _fit_rows(design, target_j, scale, rows)
    return None if fitted is None else fitted[0]


def _fit_rows(
    design: FloatArray, target_j: FloatArray, scale: FloatArray, rows: npt.NDArray[np.bool_]
) -> tuple[Fit, npt.NDArray[np.bool_]] | None:
    """The fit over `rows`, and which windows (of all) lie within the outlier limit of that fit."""
    count, columns = int(rows.sum()), design.shape[1]
    if count < columns:
        return None
    weighted = design[rows] * scale[rows, None]
    weighted_target = target_j[rows] * scale[rows]
    inverse, determined = _normal_pseudo_inverse(weighted)
    powers = inverse @ (weighted.T @ weighted_target)
    if np.any(powers < 0):
        from scipy.optimize import nnls  # imported on first use: the daemon starts without loading scipy

        powers = np.asarray(nnls(weighted, weighted_target)[0], dtype=np.float64)
    residuals = (target_j - design @ powers) * scale
    errors = np.full(columns, math.inf)
    if count > columns:
        variance = float(residuals[rows] @ residuals[rows]) / (count - columns)
        errors = np.where(determined, np.sqrt(np.maximum(np.diag(inverse), 0.0) * variance), math.inf)
    spread = MAD_TO_SIGMA * float(np.median(np.abs(residuals[rows])))
    inside = np.abs(residuals) <= OUTLIER_MADS * max(spread, _MIN_RESIDUAL_SCALE)
    return Fit(powers, errors, determined, rows), inside


def _normal_pseudo_inverse(design: FloatArray) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """(design^T design)^+ (the coefficients' covariance up to the noise variance), and which coefficients
    the design determines (False: only combinations with other coefficients are known)."""
    eigenvalues, vectors = np.linalg.eigh(design.T @ design)
    top = float(eigenvalues[-1])
    nonzero = eigenvalues > _RANK_TOLERANCE * top if top > 0 else np.zeros(eigenvalues.size, dtype=bool)
    inverse = (vectors[:, nonzero] / eigenvalues[nonzero]) @ vectors[:, nonzero].T
    determined = np.linalg.norm(vectors[:, ~nonzero], axis=1) <= _NULL_TOLERANCE
    return np.asarray(inverse, dtype=np.float64), np.asarray(determined)

"""The convex cost model of one (stage, instruction): effective cost as a function of quantised time.

Section 4 of the solver specification: fit c(q) = a exp(b q) + c0 by least squares and keep the fit with the
lowest mean squared error. Two methods:

- `fast` (default): the least-squares fit with a > 0 over the whole family the reference can return, its
  nearly-linear limit included, found directly (`exp_fit.py`): for a fixed exponent the model is linear in
  its other two coefficients, so it is a one-dimensional search; no scipy.
- `reference`: the specification's grid of 54 scipy `curve_fit` starts (Levenberg-Marquardt), exactly as the
  reference does. It is about a hundred times slower and, rarely, keeps a worse local optimum.

Where the reference crashes (no accepted fit, fewer points than parameters, costs in unusual units) this
module degrades gracefully: the reference method retries on normalised costs; both then use the lower convex
hull of the options, and say which model they used. The fast fit leaves the hull only to option sets with no
exponential fit at all: fewer than four options, equal costs.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseusd.errors import PlanningError
from perseusd.planner.exp_fit import fit_exponential
from perseusd.planner.options import OptionSet

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

GRID_A = (10.0, 100.0, 1000.0)
GRID_B_FACTORS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.1)
GRID_C = (10.0, 100.0, 1000.0)
MAX_FUNCTION_EVALUATIONS = 50000
FIT_METHODS = ("fast", "reference")


@dataclass(frozen=True)
class CostModel:
    """Effective cost (J) at every integer quantised time in [min_quant, max_quant]."""

    kind: str
    """`exponential`, `exponential-normalised`, `convex-hull` or `constant`."""
    min_quant: int
    costs_j: tuple[float, ...]
    coefficients: tuple[float, float, float] | None = None

    @property
    def max_quant(self) -> int:
        """The slowest quantised time the model covers."""
        return self.min_quant + len(self.costs_j) - 1

    def cost_j(self, quant_time: int) -> float:
        """The modelled effective cost at `quant_time` (must lie in [min_quant, max_quant])."""
        return self.costs_j[quant_time - self.min_quant]


def _exp_model(q: object, a: float, b: float, c: float) -> object:
    import numpy as np  # the reference method only: the fast path does not load numpy

    return a * np.exp(b * q) + c  # type: ignore[operator]


def _try_fit(
    q: np.ndarray, y: np.ndarray, guess: tuple[float, float, float]
) -> tuple[tuple[float, float, float], float] | None:
    import numpy as np
    from scipy.optimize import curve_fit

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            popt, pcov = curve_fit(_exp_model, q, y, p0=list(guess), maxfev=MAX_FUNCTION_EVALUATIONS)
    except (RuntimeError, ValueError, TypeError, FloatingPointError):
        return None
    a, b, c = (popt[0], popt[1], popt[2])
    if np.inf in pcov or not all(math.isfinite(float(v)) for v in (a, b, c)):
        return None
    with np.errstate(all="ignore"):
        preds = np.array([_exp_model(t, a, b, c) for t in q])
        mse = float(np.mean(np.square(y - preds)))
    if mse == math.inf or math.isnan(mse) or a < 0.0:
        return None
    return (a, b, c), mse


def _grid_fit(q: np.ndarray, y: np.ndarray, unit_time_s: float) -> tuple[float, float, float] | None:
    grid_b = [-k * unit_time_s / 0.001 for k in GRID_B_FACTORS]
    best: tuple[tuple[float, float, float], float] | None = None
    for guess in itertools.product(GRID_A, grid_b, GRID_C):
        fit = _try_fit(q, y, guess)
        if fit is not None and (best is None or fit[1] < best[1]):
            best = fit
    return None if best is None else best[0]


def _evaluate(
    coefficients: tuple[float, float, float], lo: int, hi: int, scale: float, shift: float
) -> list[float]:
    a, b, c = coefficients
    return [float(_exp_model(q, a, b, c)) * scale + shift for q in range(lo, hi + 1)]  # type: ignore[arg-type]


def lower_convex_hull(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """The lower convex hull of (q, cost) points sorted by q."""
    hull: list[tuple[int, float]] = []
    for p in sorted(points):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def _hull_costs(points: Sequence[tuple[int, float]], lo: int, hi: int) -> list[float]:
    hull = lower_convex_hull(points)
    costs = []
    for q in range(lo, hi + 1):
        for (x1, y1), (x2, y2) in itertools.pairwise(hull):
            if x1 <= q <= x2:
                costs.append(y1 + (y2 - y1) * (q - x1) / (x2 - x1))
                break
        else:
            costs.append(hull[0][1])
    return costs


def fit_cost_model(option_set: OptionSet, unit_time_s: float, method: str = "fast") -> CostModel:
    """Fit the cost model of one option set, falling back gracefully where the exponential fit fails."""
    if method not in FIT_METHODS:
        choices = ", ".join(FIT_METHODS)
        raise PlanningError(f"unknown cost-model fit method {method!r} (choose from {choices})")
    lo, hi = option_set.min_quant, option_set.max_quant
    points = [(o.quant_time, o.effective_cost_j) for o in option_set.options]
    if lo == hi:
        return CostModel("constant", lo, (points[0][1],))
    where = f"stage {option_set.stage} {option_set.instruction.value}"
    if method == "fast":
        fit = fit_exponential([p[0] for p in points], [p[1] for p in points])
        if fit is not None:
            curve = tuple(fit.cost(q) for q in range(lo, hi + 1))
            if all(map(math.isfinite, curve)):
                return CostModel("exponential", lo, curve, fit.coefficients)
    else:
        import numpy as np

        q = np.array([p[0] for p in points], dtype=np.float64)
        y = np.array([p[1] for p in points], dtype=np.float64)
        coefficients = _grid_fit(q, y, unit_time_s)
        if coefficients is not None:
            costs = _evaluate(coefficients, lo, hi, 1.0, 0.0)
            return CostModel("exponential", lo, tuple(costs), coefficients)
        shift, scale = float(y.min()), float(y.max() - y.min()) or 1.0
        coefficients = _grid_fit(q, (y - shift) / scale * 100.0, unit_time_s)
        if coefficients is not None:
            logger.warning("%s: exponential fit needed normalised costs", where)
            costs = _evaluate(coefficients, lo, hi, scale / 100.0, shift)
            return CostModel("exponential-normalised", lo, tuple(costs), coefficients)
    logger.warning("%s: no exponential fit; using the lower convex hull of the options", where)
    return CostModel("convex-hull", lo, tuple(_hull_costs(points, lo, hi)))

"""The direct exponential fit against the reference grid of scipy `curve_fit` starts."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

from perseusd.errors import PlanningError
from perseusd.planner import cost_model
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import Instruction
from perseusd.planner.exp_fit import fit_exponential
from perseusd.planner.options import Option, OptionSet, build_option_set
from perseusd.planner.profile import Profile
from tests.support.synthetic import synthetic_profile


def option_sets(profile: Profile, unit_time_s: float, p_block_w: float) -> list[OptionSet]:
    stages = sorted({m.stage for m in profile.measurements})
    return [
        build_option_set(s, i, profile.options(s, i), unit_time_s, p_block_w)
        for s in stages
        for i in (Instruction.FORWARD, Instruction.BACKWARD)
    ]


def arrays(option_set: OptionSet) -> tuple[np.ndarray, np.ndarray]:
    q = np.array([o.quant_time for o in option_set.options], dtype=np.float64)
    y = np.array([o.effective_cost_j for o in option_set.options], dtype=np.float64)
    return q, y


def mse(coefficients: tuple[float, float, float], q: np.ndarray, y: np.ndarray) -> float:
    a, b, c = coefficients
    return float(np.mean(np.square(y - (a * np.exp(b * q) + c))))


def reference_fit(q: np.ndarray, y: np.ndarray, unit_time_s: float) -> tuple[float, float, float] | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cost_model._grid_fit(q, y, unit_time_s)


CASES = [
    (bundled_profile("a100_sxm"), 0.001, 83.64),
    (synthetic_profile(3, 1003, imbalance=1.0, plateau=True, base_time_s=0.03), 0.001, 40.0),
]


@pytest.mark.parametrize(("profile", "unit_time_s", "p_block_w"), CASES)
def test_reaches_the_reference_optimum(profile: Profile, unit_time_s: float, p_block_w: float) -> None:
    for option_set in option_sets(profile, unit_time_s, p_block_w):
        q, y = arrays(option_set)
        ref = reference_fit(q, y, unit_time_s)
        fit = fit_exponential(q, y)
        assert ref is not None
        assert fit is not None
        coefficients, error = fit.coefficients, fit.mse
        assert coefficients[0] > 0
        assert error == pytest.approx(mse(coefficients, q, y), rel=1e-12)
        # Never worse than the reference; here the same optimum, so the same curve to within the
        # reference's own convergence tolerance.
        assert error <= mse(ref, q, y) * (1 + 1e-12)
        grid = np.arange(option_set.min_quant, option_set.max_quant + 1, dtype=np.float64)
        ours = coefficients[0] * np.exp(coefficients[1] * grid) + coefficients[2]
        theirs = ref[0] * np.exp(ref[1] * grid) + ref[2]
        assert np.max(np.abs(ours - theirs)) < 1e-3 * float(np.ptp(y))


def test_better_than_a_reference_fit_stuck_in_a_local_optimum() -> None:
    """Synthetic profile 1016: the 54 starts all miss the best fit of one option set (see docs/solver.md)."""
    profile = synthetic_profile(3, 1016, imbalance=0.5, plateau=True, base_time_s=0.03)
    found = []
    for option_set in option_sets(profile, 0.001, 20.398021490933992):
        q, y = arrays(option_set)
        ref, fit = reference_fit(q, y, 0.001), fit_exponential(q, y)
        assert ref is not None
        assert fit is not None
        found.append(fit.mse < mse(ref, q, y) * (1 - 1e-3))
    assert any(found)


def test_reference_switch_reproduces_the_reference_fit() -> None:
    option_set = option_sets(bundled_profile("a100_sxm"), 0.001, 83.64)[0]
    q, y = arrays(option_set)
    model = cost_model.fit_cost_model(option_set, 0.001, "reference")
    assert model.coefficients == reference_fit(q, y, 0.001)
    fast = cost_model.fit_cost_model(option_set, 0.001)
    assert fast.kind == model.kind == "exponential"
    assert max(abs(a - b) for a, b in zip(fast.costs_j, model.costs_j, strict=True)) < 1e-6
    with pytest.raises(PlanningError, match="fit method"):
        cost_model.fit_cost_model(option_set, 0.001, "newton")


def test_degenerate_inputs_give_no_fit_and_never_crash() -> None:
    def fit(q: list[int], y: list[float]) -> object:
        return fit_exponential(np.array(q, dtype=np.float64), np.array(y, dtype=np.float64))

    assert fit([1, 2, 3], [3.0, 2.0, 1.5]) is None  # an exact fit: rejected, as the reference does
    assert fit([1, 2, 3, 4], [1.0, 2.0, float("nan"), 3.0]) is None
    assert fit([2, 2, 2, 2], [1.0, 2.0, 3.0, 4.0]) is None  # one time: no exponent to fit
    flat = fit_exponential([1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0])  # a = 0, which the reference accepts
    assert flat is not None
    assert (flat.coefficients[0], flat.mse, flat.cost(2.5)) == (0.0, 0.0, 5.0)
    zigzag = fit_exponential(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 4.0, 3.0]))
    assert zigzag is not None
    assert zigzag.coefficients[0] > 0


def test_nearly_linear_options_take_the_linear_limit() -> None:
    """Concave costs: every exponential with a > 0 is convex, so the best fit is the limit of ever flatter
    ones (b -> 0, a and c0 without bound): the straight line. The reference's Levenberg-Marquardt stops on
    the way (here at b = -6.2e-7, a = 5.8e4), a little worse; the fast fit takes an exponent where the error
    is the line's to 1e-12, and evaluates it without cancellation."""
    q = np.arange(1300.0, 1700.0, 40.0)
    u = (q - q[0]) / (q[-1] - q[0])
    y = 40.0 - 10.0 * u - 3.0 * u * u
    fit = fit_exponential(q, y)
    assert fit is not None
    line = np.polyfit(q, y, 1)
    line_mse = float(np.mean(np.square(y - np.polyval(line, q))))
    assert fit.mse == pytest.approx(line_mse, rel=1e-11)
    assert abs(fit.b) * (q[-1] - q[0]) < 1e-6
    assert fit.coefficients[0] > 0
    assert max(abs(fit.cost(t) - np.polyval(line, t)) for t in q) < 1e-9
    ref = reference_fit(q, y, 0.0001)
    assert ref is not None
    assert fit.mse < mse(ref, q, y)
    options = [Option(1000 + i, t * 1e-4, c, int(t), c) for i, (t, c) in enumerate(zip(q, y, strict=True))]
    option_set = OptionSet(0, Instruction.FORWARD, tuple(reversed(options)))
    assert cost_model.fit_cost_model(option_set, 1e-4).kind == "exponential"


def test_daemon_solve_worker_does_not_load_scipy() -> None:
    code = (
        "import sys\n"
        "from perseusd.jobs import solve_worker, solving\n"
        "from perseusd.planner.bundled import bundled_profile\n"
        "from perseusd.planner.dag import build_dag\n"
        "from perseusd.planner.solver import SolverParams, solve_frontier\n"
        "points = list(solve_frontier(build_dag('1f1b', 8, 2), bundled_profile('a100_sxm'),"
        " SolverParams(0.001, 83.64)))\n"
        "assert points\n"
        "print('scipy' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "False"]


def test_the_moments_are_the_shapes_covariances_and_the_correlations_slope() -> None:
    """At every span exponent: cov(phi, y) and var(phi) as written from their definition, and the slope term
    has the sign (and, divided by var(phi)^1.5, the value) of d corr(phi, y) / ds by central differences."""
    from perseusd.planner import exp_fit

    rng = np.random.default_rng(7)
    q = np.sort(rng.choice(np.arange(1, 500), size=12, replace=False)).astype(float)
    y = 3.0 * np.exp(-0.01 * q) + rng.uniform(0.0, 0.05, size=12)
    u = (q - q[0]) / (q[-1] - q[0])
    y_c = (y - y.mean()).tolist()

    def phi(s: float) -> np.ndarray:
        u0 = 1.0 if s > 0 else 0.0
        return np.array([math.expm1(s * (v - u0)) / s if s != 0.0 else v - u0 for v in u])

    def corr_term(s: float) -> float:
        e_c = phi(s) - phi(s).mean()
        return float(e_c @ y_c / math.sqrt(e_c @ e_c))

    spans = [-40.0, -3.0, -0.6, -1e-3, 0.0, 2e-3, 0.3, 5.0, 60.0]
    for s, (cov_ey, var_e, slope) in zip(spans, exp_fit.moments_at(u.tolist(), y_c, spans), strict=True):
        e_c = phi(s) - phi(s).mean()
        assert cov_ey == pytest.approx(float(e_c @ y_c), rel=1e-12, abs=1e-15)
        assert var_e == pytest.approx(float(e_c @ e_c), rel=1e-12)
        if s != 0.0:
            h = 1e-5 * abs(s)
            numeric = (corr_term(s + h) - corr_term(s - h)) / (2 * h)
            assert slope / var_e**1.5 == pytest.approx(numeric, rel=1e-4, abs=1e-9)
    assert exp_fit.moments_at(u.tolist(), y_c, []) == []


def test_an_exponents_moments_do_not_depend_on_what_else_is_in_the_batch() -> None:
    """The refinement recomputes the bracket's ends alone: they must be the grid's bits (a BLAS product
    over the whole batch rounded differently and left the refinement an empty bracket)."""
    from perseusd.planner import exp_fit

    rng = np.random.default_rng(11)
    cases = [
        arrays(s) for name in ("a40", "h100_sxm") for s in option_sets(bundled_profile(name), 0.0002, 70.0)
    ]
    cases += [
        (np.sort(rng.uniform(1.0, 900.0, size=n)), rng.uniform(-5.0, 50.0, size=n)) for n in (5, 17, 33)
    ]
    spans = [*exp_fit.GRID[::7], *(-s for s in exp_fit.GRID[::7]), 0.0, 149.308882421805]
    for q, y in cases:
        u = ((q - q.min()) / (q.max() - q.min())).tolist()
        y_c = (y - y.mean()).tolist()
        batch = exp_fit.moments_at(u, y_c, spans)
        assert [exp_fit.moments_at(u, y_c, [s])[0] for s in spans] == batch

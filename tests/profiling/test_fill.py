"""Options at clocks the sweep did not visit (`perseusd.profiling.fill`): local curves through the measured
neighbours, trusted only where the measured clocks themselves follow them."""

from __future__ import annotations

import pytest

from perseusd.profiling.estimator import OptionEstimate, StageEstimate
from perseusd.profiling.fill import fill_stage, fit_key, fitted_options
from perseusd.profiling.sweep import pareto_options

SUPPORTED = tuple(range(900, 1981, 15))


def smooth(clock_mhz: int, key: tuple[int, str] = (0, "forward"), err: float = 0.01) -> OptionEstimate:
    """A compute-bound curve: time 2 + 8 x 1000 / f ms, power 100 + 0.3 f W."""
    time_s = (2.0 + 8.0 * 1000 / clock_mhz) / 1000
    return OptionEstimate(key, clock_mhz, 8, time_s, time_s * (100 + 0.3 * clock_mhz), 0.0, err, windows=24)


def test_a_smooth_curve_is_filled_exactly_at_every_unvisited_clock_between_measured_ones() -> None:
    measured = [smooth(c) for c in (1980, 1680, 1440, 1200, 960)]
    fit = fit_key(measured)
    assert fit is not None
    assert fit.trusted
    filled = fitted_options(measured, SUPPORTED, fit)
    clocks = sorted(o.clock_mhz for o in filled)
    assert clocks == [c for c in SUPPORTED if 960 < c < 1680 and c not in (1200, 1440)]
    for option in filled:
        truth = smooth(option.clock_mhz)
        assert option.fitted
        assert option.time_s == pytest.approx(truth.time_s, rel=1e-9)
        assert option.energy_j == pytest.approx(truth.energy_j, rel=0.002)
        assert option.energy_rel_err >= 0.01  # the neighbours' error, carried


def test_nothing_is_filled_above_the_second_highest_clock_nor_extrapolated() -> None:
    measured = [smooth(c) for c in (1980, 1680, 1440, 1200)]
    clocks = [o.clock_mhz for o in fitted_options(measured, SUPPORTED)]
    assert min(clocks) > 1200
    assert max(clocks) < 1680  # 1695-1965: a power-capped GPU's top label is not the clock it ran


def test_a_wiggling_curve_is_not_trusted_and_fills_nothing() -> None:
    measured = [smooth(c) for c in (1980, 1680, 1440, 1200, 960)]
    bumped = measured[2]
    measured[2] = OptionEstimate(bumped.key, 1440, 8, bumped.time_s, bumped.energy_j * 1.20, 0.0, 0.01)
    fit = fit_key(measured)
    assert fit is not None
    assert not fit.trusted
    assert "energy" in fit.why
    assert fitted_options(measured, SUPPORTED, fit) == []
    assert fit_key(measured[:3]) is None  # two clocks below the highest: nothing to test the curve on


@pytest.mark.parametrize(
    ("bump", "err", "trusted"), [(1.10, 0.02, True), (1.10, 0.002, True), (1.16, 0.002, False)]
)
def test_a_miss_the_measurements_own_errors_explain_does_not_mistrust_the_curve(
    bump: float, err: float, trusted: bool
) -> None:
    """9 % off at 1440 MHz: beyond the 8 % bound, within it once two standard errors of what three options
    measured to 2 % explain (4.9 %) are allowed for, and as much when they claim 0.2 %: a measured option's
    energy is taken to be at least `ENERGY_ERR_FLOOR` off (what the closed loop measures). 14 % off is not."""
    measured = [smooth(c, err=err) for c in (1980, 1680, 1440, 1200, 960)]
    bumped = measured[2]
    measured[2] = OptionEstimate(bumped.key, 1440, 8, bumped.time_s, bumped.energy_j * bump, 0.0, err)
    fit = fit_key(measured)
    assert fit is not None
    assert fit.trusted is trusted
    assert max(abs(e) for e in fit.loo_energy) > 0.08
    if not trusted:
        assert "noise" in fit.why


def test_a_stage_keeps_its_measured_options_and_adds_the_pareto_optimal_fitted_ones() -> None:
    keys = [(0, "forward"), (0, "backward")]
    clocks = (1980, 1680, 1440, 1200, 960)
    options = {(key, c): smooth(c, key) for key in keys for c in clocks}
    estimate = StageEstimate(options, 80.0, windows=40)
    kept = [options[(key, c)] for key in keys for c in clocks]
    filled, notes = fill_stage(estimate, clocks, SUPPORTED, kept)
    assert all(o in filled for o in kept)
    fitted = [o for o in filled if o.fitted]
    assert {o.key for o in fitted} == set(keys)
    for key in keys:
        candidates = [*kept, *fitted_options([o for o in kept if o.key == key], SUPPORTED)]
        front = pareto_options([o for o in candidates if o.key == key])
        mine = [o for o in fitted if o.key == key]
        assert mine
        assert all(o in front for o in mine)  # dominated fitted clocks (below the least energy) are dropped
        assert len(mine) < len([o for o in candidates if o.key == key and o.fitted])
    assert len(notes) == 2
    assert "fitted clocks" in notes[0]

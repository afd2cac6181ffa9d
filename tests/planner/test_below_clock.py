"""Costs below the lowest profiled clock: a fit of time ~ a + b/f and power ~ static + c f^k on the profiled
clocks, joined to the lowest one."""

from __future__ import annotations

import pytest

from perseusd.planner.below_clock import K_MAX, K_MIN, extrapolate_below


def _exact(
    a_s: float, b: float, static_w: float, c: float, k: float, clocks: range
) -> dict[int, tuple[float, float]]:
    out = {}
    for f in clocks:
        time_s = a_s + b / f
        out[f] = (time_s, (static_w + c * f**k) * time_s)
    return out


def test_an_exact_law_is_recovered_below_the_profile() -> None:
    truth = _exact(0.002, 9.0, 80.0, 2e-4, 1.8, range(345, 1981, 15))
    profiled = {f: v for f, v in truth.items() if f >= 900}
    below = extrapolate_below(profiled, truth, static_w=80.0)
    assert sorted(below) == [f for f in truth if f < 900]
    for f, (time_s, energy_j) in below.items():
        assert time_s == pytest.approx(truth[f][0], rel=1e-6)
        assert energy_j == pytest.approx(truth[f][1], rel=1e-6)


def test_the_exponent_is_bounded_and_the_power_never_below_static() -> None:
    # power flat in the clock: k would be 0; it is held at K_MIN, so lower clocks still draw less
    flat = {f: (10.0 / f, 300.0 * 10.0 / f) for f in (900, 1200, 1500)}
    below = extrapolate_below(flat, [450], static_w=100.0)
    time_s, energy_j = below[450]
    assert time_s == pytest.approx(10.0 / 450)
    assert energy_j / time_s == pytest.approx(100.0 + 200.0 * (450 / 900) ** K_MIN)
    steep = {f: (1.0 / f, (50.0 + 1e-12 * f**5) / f) for f in (900, 1200, 1500)}
    time_s, energy_j = extrapolate_below(steep, [450], static_w=50.0)[450]
    assert energy_j / time_s == pytest.approx(50.0 + 1e-12 * 900**5 * (450 / 900) ** K_MAX)
    cold = {900: (0.01, 0.5), 1000: (0.009, 0.5)}  # 50 W, below the static power: kept
    time_s, energy_j = extrapolate_below(cold, [600], static_w=80.0)[600]
    assert energy_j / time_s == pytest.approx(50.0)


def test_time_that_does_not_fall_with_the_clock_scales_as_one_over_f() -> None:
    odd = {900: (0.010, 3.0), 1200: (0.012, 3.0), 1500: (0.013, 3.0)}  # b < 0: not physical
    time_s, _ = extrapolate_below(odd, [450], static_w=50.0)[450]
    assert time_s == pytest.approx(0.010 * 2)
    assert extrapolate_below(odd, [900, 1980], static_w=50.0) == {}
    assert extrapolate_below({}, [450], static_w=50.0) == {}

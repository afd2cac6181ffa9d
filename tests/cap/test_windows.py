"""Window power: the measured window from counters, the worst window of a periodic plan, the replay."""

from __future__ import annotations

import pytest

from perseusd.cap.window import PowerWindow
from perseusd.power.aliasing import max_window_energy_j, periodic_worst_window_w
from perseusd.power.scenario import compare_at, scenario_for


def test_power_window_from_counters() -> None:
    window = PowerWindow(1.0)
    assert window.power() is None
    for i in range(21):  # two GPUs, 100 W and 300 W, sampled every 0.1 s
        window.add(i * 0.1, {"a": 100.0 * i * 0.1, "b": 300.0 * i * 0.1})
    reading = window.power()
    assert reading is not None
    assert reading.power_w == pytest.approx(400.0)
    assert reading.gpus == 2
    assert reading.span_s >= 1.0


def test_power_window_leaves_out_a_gpu_missing_from_a_sample() -> None:
    window = PowerWindow(1.0)
    window.add(0.0, {"a": 0.0, "b": 0.0})
    window.add(1.0, {"a": 100.0})
    reading = window.power()
    assert reading is not None
    assert (reading.power_w, reading.gpus) == (100.0, 1)


def test_window_refuses_zero() -> None:
    with pytest.raises(ValueError, match="window"):
        PowerWindow(0.0)


def test_max_window_energy_finds_the_densest_slice() -> None:
    segments = [(0.0, 0.2, 100.0), (0.5, 0.6, 1000.0)]
    assert max_window_energy_j(segments, 0.0, 1.0, 0.1) == pytest.approx(100.0)
    assert max_window_energy_j(segments, 0.0, 1.0, 1.0) == pytest.approx(120.0)


def test_periodic_worst_window_above_the_mean_when_the_window_is_not_whole_iterations() -> None:
    # 0.4 s iterations: 0.1 s at +1000 W, the rest at the base 100 W. Mean 350 W.
    segments = [(0.0, 0.1, 1000.0)]
    whole = periodic_worst_window_w(segments, 0.4, 100.0, 0.8)
    assert whole == pytest.approx(350.0)
    # 1 s = 2.5 iterations: the half iteration can hold the whole burst.
    worst = periodic_worst_window_w(segments, 0.4, 100.0, 1.0)
    assert worst == pytest.approx(100.0 + 3 * 100.0 / 1.0)
    assert worst > 350.0


def test_h100_cap_within_windows_and_half_the_uniform_slowdown_at_70pct() -> None:
    """The benchmark's claim, on the board's cost model (deterministic: no timing involved)."""
    row = compare_at(scenario_for("h100_sxm", 4, 8), 0.7)
    cap, uniform = row["perseusd"], row["uniform"]
    assert cap["worst_window_w"] <= row["budget_w"] * 1.01
    assert 0 <= cap["slowdown"] <= 0.5 * uniform["slowdown"]
    assert cap["energy_change"] < 0

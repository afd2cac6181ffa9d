"""Plans a GPU can follow: what each computation really runs at, given the clock-switch latency."""

from __future__ import annotations

import pytest

from perseusd.planner.switching import SwitchModel, followable_point, followable_stage_clocks, runs_of

H100 = SwitchModel(latency_s=0.012, lead_s=0.014)  # a lock acts ~12 ms after it is asked for
CLOCKS = (900, 1200, 1500, 1980)


def _time_at(times_s: list[float]):  # type: ignore[no-untyped-def]
    """Computation i takes times_s[i] at 1980 MHz and proportionally longer at lower clocks."""
    return lambda i, clock_mhz: times_s[i] * 1980 / clock_mhz


def _snap(_i: int, clock_mhz: int) -> int:
    return min((c for c in CLOCKS if c >= clock_mhz), default=max(CLOCKS))


def test_runs_are_cyclic() -> None:
    assert runs_of([1, 1, 2, 2, 1]) == [[2, 3], [4, 0, 1]]
    assert runs_of([3, 3]) == [[0, 1]]
    assert runs_of([]) == []


def test_long_computations_keep_their_clocks() -> None:
    clocks = [1980, 900, 1500, 1200]
    assert followable_stage_clocks(clocks, _time_at([0.04] * 4), _snap, H100) == clocks


def test_instant_switches_keep_every_clock() -> None:
    clocks = [1980, 900, 1500, 900, 1980, 1200]
    instant = SwitchModel(0.0, 0.0)
    assert followable_stage_clocks(clocks, _time_at([0.001] * 6), _snap, instant) == clocks


def test_a_short_valley_runs_at_the_clock_before_it() -> None:
    """A lowering acts 12 ms into the run: a 5 ms computation at 900 MHz finishes at 1980 MHz."""
    clocks = [1980, 900, 1980, 1980]
    times = [0.040, 0.005 * 900 / 1980, 0.040, 0.040]
    assert followable_stage_clocks(clocks, _time_at(times), _snap, H100) == [1980] * 4


def test_only_the_start_of_a_long_lowered_run_runs_high() -> None:
    clocks = [1980, 1200, 1200, 1200]
    times = [0.040, 0.008, 0.008, 0.008]  # at 1200 MHz 13 ms each: the lowering acts inside the first
    assert followable_stage_clocks(clocks, _time_at(times), _snap, H100) == [1980, 1980, 1200, 1200]


def test_a_raise_after_a_short_run_comes_late() -> None:
    """A raise into the 1980 run is asked for at the 5 ms run's begin and acts 12 ms later: that run runs
    at 1980, and the raised run's first computation (4 ms) mostly before it, at the run's lower clock."""
    clocks = [900, 1200, 1980, 1980, 900]
    times = [0.030, 0.004, 0.003, 0.030, 0.030]
    effective = followable_stage_clocks(clocks, _time_at(times), _snap, H100)
    assert effective == [900, 1200, 1200, 1980, 900]


def test_a_raise_after_a_long_run_is_in_time() -> None:
    clocks = [900, 900, 1980, 900]
    times = [0.030, 0.030, 0.030, 0.030]
    assert followable_stage_clocks(clocks, _time_at(times), _snap, H100) == clocks


def test_followable_point_counts_what_changed() -> None:
    stages = ([1980, 900, 1980, 1980], [1500, 1500, 1500, 1500])
    times = [0.040, 0.002, 0.040, 0.040]
    point = followable_point(stages, lambda _s: _time_at(times), lambda _s: _snap, H100)
    assert point.clocks_mhz == ((1980,) * 4, (1500,) * 4)
    assert point.changed == 1


def test_model_is_checked() -> None:
    with pytest.raises(ValueError, match="latency_s <= lead_s"):
        SwitchModel(latency_s=0.02, lead_s=0.01)

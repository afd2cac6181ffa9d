"""The sweep's clock order, precision waits, rise stop and Pareto skip, on synthetic estimates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from perseusd.profiling.estimator import OptionEstimate, StageEstimate
from perseusd.profiling.sweep import MIN_KEY_WINDOWS, StageSweep, SweepSettings, pareto_options
from perseusd.profiling.trace import OptionKey

FWD: OptionKey = (0, "forward")
BWD: OptionKey = (0, "backward")
CLOCKS = list(range(1410, 854, -15))


def option(key: OptionKey, clock: int, time_s: float, energy_j: float, **extra: float) -> OptionEstimate:
    values: dict[str, float] = {"count": 12, "time_rel_err": 0.0, "energy_rel_err": 0.002, "windows": 200}
    values.update(extra)
    return OptionEstimate(
        key=key,
        clock_mhz=clock,
        count=int(values["count"]),
        time_s=time_s,
        energy_j=energy_j,
        time_rel_err=values["time_rel_err"],
        energy_rel_err=values["energy_rel_err"],
        windows=int(values["windows"]),
    )


def estimate_of(
    clocks: list[int], energy: Callable[[OptionKey, int], float], **extra: float
) -> StageEstimate:
    """Options for both keys at `clocks`: time 1410 / clock x the key's base, energy from `energy`."""
    options = {}
    for key in (FWD, BWD):
        base_s = 0.05 if key == FWD else 0.1
        for clock in clocks:
            options[(key, clock)] = option(key, clock, base_s * 1410 / clock, energy(key, clock), **extra)
    return StageEstimate(options, 80.0, 100)


def run_sweep(sweep: StageSweep, energy: Callable[[OptionKey, int], float], **extra: float) -> list[int]:
    """Drive the sweep to the end, one iteration per call, and return the clock of each iteration."""
    ran: list[int] = []
    while (clock := sweep.current_clock_mhz) is not None:
        ran.append(clock)
        assert len(ran) < 1000
        sweep.iteration_done(estimate_of(sorted(set(ran)), energy, **extra))
    return ran


def valley(bottom_fwd: int, bottom_bwd: int) -> Callable[[OptionKey, int], float]:
    """Energy falls towards the key's bottom clock and rises below it."""

    def energy(key: OptionKey, clock: int) -> float:
        bottom = bottom_fwd if key == FWD else bottom_bwd
        return 20.0 + abs(clock - bottom) / 15

    return energy


def test_clocks_go_down_from_the_highest_with_stride_and_floor() -> None:
    settings = SweepSettings(clock_stride=3, min_clock_mhz=1000)
    sweep = StageSweep([900, *CLOCKS], [FWD], settings)
    expected = [c for c in CLOCKS if c >= 1000][::3]
    assert sweep.clocks_total == len(expected)
    assert run_sweep(sweep, lambda _k, c: float(c)) == expected
    assert sweep.done
    assert sweep.clocks_done == len(expected)


def test_rise_stop_waits_for_every_key_and_counts_rises_in_a_row() -> None:
    sweep = StageSweep(CLOCKS, [FWD, BWD], SweepSettings(rise_limit=3))
    ran = run_sweep(sweep, valley(bottom_fwd=1290, bottom_bwd=1200))
    # Backward bottoms out at 1200: it rises at 1185, 1170 and 1155, and the sweep stops there.
    assert ran == [c for c in CLOCKS if c >= 1155]
    assert (sweep.done, sweep.clocks_done, sweep.current_clock_mhz) == (True, len(ran), None)


def test_a_single_noisy_rise_does_not_stop_the_sweep() -> None:
    def energy(key: OptionKey, clock: int) -> float:
        bump = 1.5 if clock in {1335, 1290, 1245} else 0.0  # one step down saves 1 J
        return valley(1095, 1095)(key, clock) + bump

    sweep = StageSweep(CLOCKS, [FWD, BWD], SweepSettings(rise_limit=2))
    assert run_sweep(sweep, energy)[-1] == 1065  # rises at 1080 and 1065


def test_a_clock_waits_for_computations_and_precision() -> None:
    settings = SweepSettings(min_computations=8, max_iterations_per_clock=3, min_windows_per_clock=100)
    sweep = StageSweep(CLOCKS[:2], [FWD, BWD], settings)
    flat = valley(0, 0)
    sweep.iteration_done(estimate_of([1410], flat, count=4))
    sweep.iteration_done(estimate_of([1410], flat, count=8, energy_rel_err=0.02))
    assert sweep.current_clock_mhz == 1410
    sweep.iteration_done(estimate_of([1410], flat, count=12, energy_rel_err=0.005))
    assert (sweep.current_clock_mhz, sweep.clocks_done) == (1395, 1)


def test_precision_needs_a_fit_of_enough_windows_and_a_few_per_key() -> None:
    """`min_precise_windows` counts the fit's windows (every standard error rests on all its residuals): one
    long iteration (an A100's, ~28 windows) can finish a clock although each key overlapped fewer, but a
    key must overlap `MIN_KEY_WINDOWS` of them, and a fit of fewer windows never finishes one."""
    settings = SweepSettings(min_precise_windows=24, max_iterations_per_clock=5, min_windows_per_clock=100)
    flat = valley(0, 0)

    def clocks_done_after(fit_windows: int, **extra: float) -> int:
        sweep = StageSweep(CLOCKS, [FWD, BWD], settings)
        sweep.iteration_done(replace(estimate_of([1410], flat, **extra), windows=fit_windows))
        return sweep.clocks_done

    assert clocks_done_after(28, energy_rel_err=0.009, windows=12) == 1
    assert clocks_done_after(28, energy_rel_err=0.009, windows=MIN_KEY_WINDOWS) == 1
    assert clocks_done_after(28, energy_rel_err=0.009, windows=MIN_KEY_WINDOWS - 1) == 0
    assert clocks_done_after(23, energy_rel_err=0.001, windows=23) == 0
    assert clocks_done_after(28, energy_rel_err=0.011, windows=28) == 0


def test_giving_up_on_precision_waits_for_enough_counter_windows() -> None:
    settings = SweepSettings(
        max_iterations_per_clock=2, min_windows_per_clock=50, hard_max_iterations_per_clock=5
    )
    flat = valley(0, 0)
    few = StageSweep(CLOCKS, [FWD, BWD], settings)
    imprecise = estimate_of([1410], flat, energy_rel_err=0.05, windows=10)
    for _ in range(4):
        few.iteration_done(imprecise)
        assert few.current_clock_mhz == 1410
    few.iteration_done(imprecise)
    assert few.current_clock_mhz == 1395
    many = StageSweep(CLOCKS, [FWD, BWD], settings)
    for _ in range(2):
        many.iteration_done(estimate_of([1410], flat, energy_rel_err=0.05, windows=60))
    assert many.current_clock_mhz == 1395


def test_a_missing_option_keeps_the_clock_until_the_hard_cap() -> None:
    sweep = StageSweep(
        CLOCKS, [FWD, BWD], SweepSettings(max_iterations_per_clock=2, hard_max_iterations_per_clock=4)
    )
    empty = StageEstimate({}, None, 0)
    for _ in range(3):
        sweep.iteration_done(empty)
    assert sweep.current_clock_mhz == 1410
    sweep.iteration_done(empty)
    assert sweep.current_clock_mhz == 1395


def test_kept_skips_clocks_that_cannot_be_pareto_optimal() -> None:
    sweep = StageSweep(CLOCKS, [FWD, BWD], SweepSettings(rise_limit=3))
    energy = valley(bottom_fwd=1290, bottom_bwd=1200)
    ran = run_sweep(sweep, energy)
    estimate = estimate_of(sorted(set(ran)), energy)
    kept = sweep.kept(estimate)
    assert [(o.key, o.clock_mhz) for o in kept if o.key == FWD] == [(FWD, c) for c in ran if c >= 1290]
    assert [(o.key, o.clock_mhz) for o in kept if o.key == BWD] == [(BWD, c) for c in ran if c >= 1200]
    foreign = dict(estimate.options)
    foreign[((3, "forward"), 1410)] = option((3, "forward"), 1410, 0.01, 1.0)
    foreign[(FWD, 1234)] = option(FWD, 1234, 0.01, 1.0)
    assert sweep.kept(StageEstimate(foreign, 80.0, 100)) == kept


def test_pareto_filter_keeps_the_higher_clock_of_exact_ties() -> None:
    a = option(FWD, 1410, 0.05, 20.0)
    tie = option(FWD, 1395, 0.05, 20.0)
    slower_cheaper = option(FWD, 1200, 0.06, 18.0)
    slower_same = option(FWD, 1100, 0.07, 18.0)
    slower_costlier = option(FWD, 1000, 0.08, 21.0)
    assert pareto_options([slower_costlier, tie, slower_same, a, slower_cheaper]) == [a, slower_cheaper]
    assert pareto_options([]) == []


def test_a_waiting_gpu_keeps_lower_clocks_that_cost_less_than_the_wait_they_fill() -> None:
    top = option(FWD, 1410, 0.050, 20.0)
    least = option(FWD, 1110, 0.060, 18.0)  # the least energy
    below = option(FWD, 900, 0.070, 18.5)  # +0.5 J for +10 ms: under 100 W x 10 ms = 1 J of waiting
    far_below = option(FWD, 600, 0.100, 22.0)  # +3.5 J for +30 ms: over the 3 J the wait would draw
    options = [far_below, below, least, top]
    assert pareto_options(options) == [top, least]
    assert pareto_options(options, waiting_w=100.0) == [top, least, below]
    assert pareto_options(options, waiting_w=150.0) == [top, least, below, far_below]
    estimate = StageEstimate({(o.key, o.clock_mhz): o for o in options}, 100.0, 100)
    sweep = StageSweep([600, 900, 1110, 1410], [FWD], SweepSettings())
    assert sweep.kept(estimate, waiting_w=100.0) == [top, least, below]


def test_the_highest_clock_set_aside_removes_no_clock_below_it() -> None:
    """The daemon's filters keep the highest clock (all-max) and let it beat nothing: a forward estimated
    low at the power-capped top (split from the backward it runs beside) must not drop the clocks below."""
    top = option(FWD, 1980, 0.0290, 19.25)  # the truth: 20.3 J
    below = option(FWD, 1725, 0.0293, 19.56)
    tie = option(FWD, 1710, 0.0293, 19.56)
    costlier = option(FWD, 1695, 0.0295, 20.5)  # beaten by `below`
    lower = option(FWD, 1215, 0.0390, 17.7)
    options = [lower, costlier, tie, below, top]
    assert pareto_options(options) == [top, lower]
    assert pareto_options(options, top_aside=True) == [top, below, lower]
    capped = option(FWD, 1980, 0.0300, 21.0)  # slower than the clock below it: still kept, after it
    assert pareto_options([capped, below, lower], top_aside=True) == [below, capped, lower]
    estimate = StageEstimate({(o.key, o.clock_mhz): o for o in options}, 100.0, 100)
    sweep = StageSweep([1215, 1695, 1710, 1725, 1980], [FWD], SweepSettings())
    assert sweep.kept(estimate, top_aside=True) == [top, below, lower]


def test_degenerate_sweeps_are_done_at_once() -> None:
    assert StageSweep([], [FWD], SweepSettings()).current_clock_mhz is None
    assert StageSweep(CLOCKS, [], SweepSettings()).done
    floor = StageSweep(CLOCKS, [FWD], SweepSettings(min_clock_mhz=2000))
    assert (floor.done, floor.clocks_total, floor.kept(StageEstimate({}, None, 0))) == (True, 0, [])
    with pytest.raises(ValueError, match="clock_stride"):
        SweepSettings(clock_stride=0)
    with pytest.raises(ValueError, match="target_energy_rel_err"):
        SweepSettings(target_energy_rel_err=0.0)


H100_CLOCKS = list(range(1980, 344, -15))


def test_a_budget_spaces_the_clocks_at_the_pace_of_the_highest() -> None:
    settings = SweepSettings(iteration_budget=40, max_iterations_per_clock=8, hard_max_iterations_per_clock=8)
    sweep = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    imprecise = estimate_of([1980], lambda _k, _c: 20.0, energy_rel_err=0.05, windows=10)
    for _ in range(8):  # the highest clock takes 8 iterations: 40 / 8 = 5 clocks in all
        sweep.iteration_done(imprecise)
    # 4 clocks below 1980 over the 66 clocks down to 990 MHz: every 17th, from one stride below the top.
    assert sweep.clocks_mhz[:5] == (1980, 1725, 1470, 1215, 960)
    assert sweep.current_clock_mhz == 1725
    fast = StageSweep(H100_CLOCKS, [FWD, BWD], SweepSettings(iteration_budget=40))
    fast.iteration_done(estimate_of([1980], lambda _k, _c: 20.0))  # 1 iteration: 39 more fit, every 2nd
    assert fast.clocks_mhz[:3] == (1980, 1950, 1920)


def test_below_the_budgets_range_the_clocks_come_twice_as_close() -> None:
    """The least energy lies near half the highest clock, and plans that fill waits want clocks in the gap
    around it: dense8x8's reference runs 900-945 MHz, between the budget's 960 and 705."""
    settings = SweepSettings(
        iteration_budget=40, max_iterations_per_clock=8, hard_max_iterations_per_clock=8, rise_span_mhz=75
    )
    sweep = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    imprecise = estimate_of([1980], lambda _k, _c: 20.0, energy_rel_err=0.05, windows=10)
    for _ in range(8):
        sweep.iteration_done(imprecise)
    assert sweep.clocks_mhz == (1980, 1725, 1470, 1215, 960, 840, 720, 600, 480, 360)
    paced = StageSweep(H100_CLOCKS, [FWD, BWD], settings)  # 4 iterations: 120 MHz apart; 60 too close
    for _ in range(3):
        paced.iteration_done(imprecise)
    paced.iteration_done(estimate_of([1980], lambda _k, _c: 20.0))  # precise at the 4th iteration
    assert paced.clocks_mhz[8:11] == (1020, 900, 780)
    unbudgeted = StageSweep(H100_CLOCKS, [FWD], SweepSettings(clock_stride=17))
    assert unbudgeted.clocks_mhz == tuple(H100_CLOCKS[::17])


def falling(_key: OptionKey, clock: int) -> float:
    return 10.0 + clock / 100  # never rises: only the clocks and the limits end a sweep


def limited_sweep(limit: int) -> StageSweep:
    """An H100 stage's sweep with the daemon's budget (8 iterations at most per clock) and `limit` as its
    `deep_iteration_limit`."""
    settings = SweepSettings(
        iteration_budget=40,
        max_iterations_per_clock=8,
        hard_max_iterations_per_clock=8,
        rise_span_mhz=75,
        deep_iteration_limit=limit,
    )
    return StageSweep(H100_CLOCKS, [FWD, BWD], settings)


def test_deep_clocks_begin_only_within_their_iteration_limit() -> None:
    """Below the first clock under the budget's range a clock begins only if the most it can take still fits
    `deep_iteration_limit`; the range's clocks and that first one always run."""

    def sweep_with(limit: int) -> list[int]:
        return run_sweep(limited_sweep(limit), falling, energy_rel_err=0.05, windows=10)

    unlimited = sweep_with(0)  # 8 iterations at each of 10 clocks
    assert (len(unlimited), sorted(set(unlimited))[:2]) == (80, [360, 480])
    limited = sweep_with(60)  # after 960, 40 iterations: 840 and 720 fit (56 <= 60), 600 would not (64)
    assert sorted(set(limited), reverse=True) == [1980, 1725, 1470, 1215, 960, 840, 720]
    assert sorted(set(sweep_with(20)), reverse=True) == [1980, 1725, 1470, 1215, 960]
    with pytest.raises(ValueError, match="deep_iteration_limit"):
        SweepSettings(deep_iteration_limit=-1)


def test_a_budget_holds_when_the_highest_clock_was_quick_by_luck() -> None:
    """The highest clock's pace spaces the others; when the clocks below take longer (an 8-stage job's stage
    was precise at its highest clock in one iteration, then took three at each of its 30 MHz clocks: 98
    iterations), the clocks left are spaced again at the pace they took, within `deep_iteration_limit`."""

    def ran_with(per_clock: int, limit: int) -> list[int]:
        sweep = limited_sweep(limit)
        ran: list[int] = []
        while (clock := sweep.current_clock_mhz) is not None:
            ran.append(clock)
            precise = ran.count(clock) >= (1 if clock == H100_CLOCKS[0] else per_clock)
            done = sorted(set(ran) - {clock})
            estimate = estimate_of(done, falling)
            noisy = estimate_of([clock], falling, energy_rel_err=0.002 if precise else 0.05, windows=200)
            sweep.iteration_done(StageEstimate(estimate.options | noisy.options, 80.0, 100))
        return ran

    unheld = ran_with(3, 0)  # no limit: 34 clocks 30 MHz apart down to 990 MHz, 3 iterations each
    assert len(unheld) > 80
    held = ran_with(3, 76)
    assert len(held) <= 76
    clocks = sorted(set(held), reverse=True)
    assert clocks[:4] == [1980, 1950, 1920, 1890]  # spaced at the highest clock's pace
    assert clocks[4:6] == [1800, 1710]  # then 90 MHz apart: 30 clocks at 3 iterations fit 10
    assert sum(1 for c in held if c >= 990) <= 41  # the budget's range: about its 40 iterations
    quick = ran_with(1, 76)  # the pace held: the spacing stays
    assert sorted(set(quick), reverse=True)[:6] == [1980, 1950, 1920, 1890, 1860, 1830]


def test_clocks_above_the_capped_clock_are_skipped() -> None:
    settings = SweepSettings(iteration_budget=40, max_iterations_per_clock=8, hard_max_iterations_per_clock=8)
    sweep = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    imprecise = estimate_of([1980], lambda _k, _c: 20.0, energy_rel_err=0.05, windows=10)
    for _ in range(8):
        sweep.iteration_done(imprecise, capped_clock_mhz=1655)  # the GPU ran ~1655 MHz whatever the lock
    assert sweep.clocks_mhz[:4] == (1980, 1650, 1395, 1140)
    uncapped = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    for _ in range(8):
        uncapped.iteration_done(imprecise, capped_clock_mhz=1970)  # barely capped: the stride decides
    assert uncapped.clocks_mhz[1] == 1725


def test_a_rise_needs_a_slower_clock_and_a_span() -> None:
    flat_top = StageSweep(H100_CLOCKS[::17], [FWD], SweepSettings(rise_limit=1))
    # Capped top: 1980 and 1725 take the same time; noise makes 1725 costlier. Not a rise: go on.
    flat = {1980: (0.05, 20.0), 1725: (0.05, 20.3), 1470: (0.055, 18.0)}
    for clock in (1980, 1725):
        options = {(FWD, c): option(FWD, c, *flat[c]) for c in flat if c >= clock}
        flat_top.iteration_done(StageEstimate(options, 80.0, 100))
    assert flat_top.current_clock_mhz == 1470
    close = SweepSettings(rise_limit=1, rise_span_mhz=75)
    sweep = StageSweep(CLOCKS, [FWD, BWD], close)  # 15 MHz apart: 5 rises in a row
    assert run_sweep(sweep, valley(bottom_fwd=1290, bottom_bwd=1200))[-1] == 1125


def test_a_budget_measures_its_clocks_even_after_a_rise_near_the_top() -> None:
    # Timing noise in a closed loop once made the second of an H100 stage's budgeted clocks look slower and
    # costlier than the first; the sweep stopped there and the stage kept its highest clock only. Within the
    # budget's range a rise never ends the sweep; below it, it does.
    settings = SweepSettings(
        iteration_budget=40, max_iterations_per_clock=8, hard_max_iterations_per_clock=8, rise_limit=1
    )

    def energy(_key: OptionKey, clock: int) -> float:
        if clock == 1725:
            return 25.0  # the noisy rise: costlier than 1980 (and slower, as every lower clock is)
        return 20.0 - (1980 - clock) / 200 if clock >= 1215 else 30.0  # a real rise below 1215

    sweep = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    ran = run_sweep(sweep, energy, energy_rel_err=0.05, windows=10)
    assert sorted(set(ran), reverse=True) == [1980, 1725, 1470, 1215, 960]
    assert sweep.done


def test_where_one_rise_stops_the_sweep_it_must_rise_beyond_the_noise() -> None:
    # A recomputing stage's energy is flat within 0.5 % from 1215 MHz down to 720 on an H100: a rise at the
    # first clock under the budget's range was noise, and one job's runs stopped there or went on by chance.
    # Every clock given up on at 8 iterations (never precise): clocks 255 MHz apart, then 120.
    budget = {"iteration_budget": 40, "max_iterations_per_clock": 8, "hard_max_iterations_per_clock": 8}
    settings = SweepSettings(**budget, rise_limit=1, rise_span_mhz=75, target_energy_rel_err=0.0005)

    def flat_then_rising(_key: OptionKey, clock: int) -> float:
        if clock >= 1215:
            return 20.0 - (1980 - clock) / 200
        return 16.2 + (0.1 if clock == 960 else 0.0) + (3.0 if clock <= 720 else 0.0)

    noisy = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    ran = run_sweep(noisy, flat_then_rising, energy_rel_err=0.0075, windows=10)  # 0.6 % up: within the noise
    assert sorted(set(ran), reverse=True) == [1980, 1725, 1470, 1215, 960, 840, 720]
    precise = StageSweep(H100_CLOCKS, [FWD, BWD], settings)
    ran = run_sweep(precise, flat_then_rising, energy_rel_err=0.001, windows=10)  # the same rise, beyond it
    assert sorted(set(ran), reverse=True) == [1980, 1725, 1470, 1215, 960]

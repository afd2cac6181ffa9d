"""The estimator on synthetic counters with a known answer: recovery, robustness, degenerate inputs."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import pytest

from perseusd.profiling.estimator import (
    NOMINAL_IDLE_SHARE,
    StageEstimate,
    estimate_segment,
    estimate_stage,
    segment_stand_in_w,
)
from perseusd.profiling.trace import CounterSample, CounterTrace, Interval, OptionKey

MS = 1_000_000
FWD: OptionKey = (0, "forward")
BWD: OptionKey = (0, "backward")
P_BLOCK_W = 80.0
POWERS_W = {(FWD, 1410): 400.0, (BWD, 1410): 450.0, (FWD, 1200): 300.0, (BWD, 1200): 330.0}


def pipeline_intervals(iterations: int, clocks_mhz: Sequence[int]) -> list[Interval]:
    """1F1B-like bursts: 4 forwards, alternating B/F, 4 backwards, with bubbles; one clock per iteration."""
    rng = random.Random(3)
    intervals: list[Interval] = []
    t_ns = 1_000 * MS
    for iteration in range(iterations):
        clock = clocks_mhz[iteration % len(clocks_mhz)]
        slow = 1410 / clock
        order = [FWD] * 4 + [BWD, FWD] * 4 + [BWD] * 4
        for key in order:
            length_ns = round((30 if key == FWD else 55) * MS * slow)
            intervals.append(Interval(key, clock, t_ns, t_ns + length_ns))
            t_ns += length_ns + rng.randrange(0, 40 * MS)
    return intervals


def true_energy_j(intervals: Sequence[Interval], t_ns: int, origin_ns: int) -> float:
    """Energy from `origin_ns` to `t_ns`: blocking power plus each computation's excess power."""
    energy_j = P_BLOCK_W * (t_ns - origin_ns) / 1e9
    for interval in intervals:
        overlap_ns = max(0, min(t_ns, interval.end_ns) - max(origin_ns, interval.start_ns))
        excess_w = POWERS_W[(interval.key, interval.clock_mhz)] - P_BLOCK_W
        energy_j += excess_w * overlap_ns / 1e9
    return energy_j


def counter_samples(
    intervals: Sequence[Interval], *, noise: float = 0.0, skip: tuple[int, int] = (0, 0)
) -> list[CounterSample]:
    """A counter updated every 100 ms (each increment with relative gaussian `noise`), read every ~10 ms.

    Reads with skip[0] <= t < skip[1] are missed (a stalled sampler).
    """
    rng = random.Random(11)
    origin_ns = intervals[0].start_ns - 150 * MS
    end_ns = intervals[-1].end_ns + 150 * MS
    trace = CounterTrace()
    published_j, published_true_j, next_update_ns = 0.0, 0.0, origin_ns + 100 * MS
    t_ns = origin_ns
    while t_ns < end_ns:
        if t_ns >= next_update_ns:
            true_j = true_energy_j(intervals, t_ns, origin_ns)
            published_j += (true_j - published_true_j) * (1.0 + noise * rng.gauss(0.0, 1.0))
            published_true_j = true_j
            next_update_ns += 100 * MS * ((t_ns - next_update_ns) // (100 * MS) + 1)
        if not skip[0] <= t_ns < skip[1]:
            trace.add(t_ns, round(published_j * 1000))
        t_ns += 10 * MS + rng.randrange(0, MS)
    return trace.samples()


def assert_matches_truth(estimate: StageEstimate, intervals: Sequence[Interval], rel: float) -> None:
    assert set(estimate.options) == set(POWERS_W)
    for (key, clock), option in estimate.options.items():
        durations = [i.end_ns - i.start_ns for i in intervals if (i.key, i.clock_mhz) == (key, clock)]
        mean_s = sum(durations) / len(durations) / 1e9
        assert option.count == len(durations)
        assert option.time_s == pytest.approx(mean_s, rel=1e-9)
        assert option.energy_j == pytest.approx(POWERS_W[(key, clock)] * mean_s, rel=rel)


def test_recovers_powers_exactly_from_a_noise_free_counter_across_clock_changes() -> None:
    intervals = pipeline_intervals(6, [1410, 1200])
    samples = counter_samples(intervals)
    estimate = estimate_stage(intervals, samples)
    assert_matches_truth(estimate, intervals, rel=1e-4)
    assert estimate.p_block_w == pytest.approx(P_BLOCK_W, rel=1e-4)
    assert estimate.windows >= len(samples) - 10
    changes = [(a, b) for a, b in itertools.pairwise(intervals) if a.clock_mhz != b.clock_mhz]
    spanning = [
        (s0, s1)
        for s0, s1 in itertools.pairwise(samples)
        if any(s0.t_ns < a.end_ns and b.start_ns < s1.t_ns for a, b in changes)
    ]
    assert spanning, "no window spans a clock change: the test does not test that"


def test_noisy_counter_gives_errors_its_standard_errors_explain() -> None:
    intervals = pipeline_intervals(40, [1410, 1200])
    estimate = estimate_stage(intervals, counter_samples(intervals, noise=0.01))
    assert_matches_truth(estimate, intervals, rel=0.03)
    for (key, clock), option in estimate.options.items():
        true_j = POWERS_W[(key, clock)] * option.time_s
        assert 0 < option.energy_rel_err < 0.02
        assert abs(option.energy_j / true_j - 1) < 4 * option.energy_rel_err
        assert option.time_rel_err == 0.0


def test_given_blocking_power_is_used_not_regressed() -> None:
    intervals = pipeline_intervals(4, [1410, 1200])
    estimate = estimate_stage(intervals, counter_samples(intervals), p_block_w=P_BLOCK_W)
    assert estimate.p_block_w == P_BLOCK_W
    assert_matches_truth(estimate, intervals, rel=1e-4)
    wrong = estimate_stage(intervals, counter_samples(intervals), p_block_w=2 * P_BLOCK_W)
    assert wrong.p_block_w == 2 * P_BLOCK_W
    assert wrong.options[(FWD, 1410)].energy_j != pytest.approx(estimate.options[(FWD, 1410)].energy_j)


def test_a_gap_in_sampling_drops_the_long_window_and_the_next() -> None:
    intervals = pipeline_intervals(4, [1410, 1200])
    whole = estimate_stage(intervals, counter_samples(intervals))
    middle_ns = (intervals[0].start_ns + intervals[-1].end_ns) // 2
    # The counter goes on updating while nobody reads it: the read after the gap sees an older update.
    samples = counter_samples(intervals, skip=(middle_ns, middle_ns + 450 * MS))
    gapped = estimate_stage(intervals, samples)
    lost = len(counter_samples(intervals)) - len(samples)
    assert gapped.windows == whole.windows - lost - 2
    assert_matches_truth(gapped, intervals, rel=1e-4)


def test_a_stretched_interval_is_a_time_outlier_and_its_windows_are_not_fitted() -> None:
    intervals = pipeline_intervals(4, [1410])
    samples = counter_samples(intervals)
    victim = next(i for i, iv in enumerate(intervals) if iv.key == FWD and i > 20)
    stalled = intervals[victim]
    # The computation's end event came late (a CPU stall): the GPU was idle during the extra time.
    following = intervals[victim + 1].start_ns
    recorded = [*intervals]
    recorded[victim] = Interval(stalled.key, stalled.clock_mhz, stalled.start_ns, following - MS)
    estimate = estimate_stage(recorded, samples)
    forward = estimate.options[(FWD, 1410)]
    assert forward.count == sum(1 for iv in intervals if iv.key == FWD) - 1
    assert forward.time_s == pytest.approx(0.030, rel=1e-4)
    assert forward.energy_j == pytest.approx(400.0 * 0.030, rel=1e-4)


def test_an_outlying_counter_window_is_dropped() -> None:
    intervals = pipeline_intervals(6, [1410, 1200])
    samples = counter_samples(intervals, noise=0.002)
    spike = len(samples) // 2
    corrupted = [
        CounterSample(s.t_ns, s.energy_mj + (20_000 if index >= spike else 0))
        for index, s in enumerate(samples)
    ]
    clean = estimate_stage(intervals, samples)
    estimate = estimate_stage(intervals, corrupted)
    assert estimate.windows == clean.windows - 1
    assert_matches_truth(estimate, intervals, rel=0.01)


def test_activity_outside_the_recorded_computations_is_ignored() -> None:
    intervals = pipeline_intervals(4, [1410])
    unrecorded = Interval(FWD, 1200, intervals[0].start_ns - 140 * MS, intervals[0].start_ns - 5 * MS)
    samples = counter_samples([unrecorded, *intervals])
    estimate = estimate_stage(intervals, samples)
    assert estimate.options[(FWD, 1410)].energy_j == pytest.approx(400.0 * 0.030, rel=1e-4)
    assert estimate.p_block_w == pytest.approx(P_BLOCK_W, rel=1e-4)


def test_degenerate_inputs_give_empty_estimates_not_exceptions() -> None:
    intervals = pipeline_intervals(2, [1410])
    samples = counter_samples(intervals)
    assert estimate_stage([], samples) == StageEstimate({}, None, 0)
    assert estimate_stage([], samples, p_block_w=70.0) == StageEstimate({}, 70.0, 0)
    assert estimate_stage([], []) == StageEstimate({}, None, 0)
    assert estimate_stage(intervals, []) == StageEstimate({}, None, 0)
    assert estimate_stage(intervals, samples[:1]) == StageEstimate({}, None, 0)
    flat = [CounterSample(s.t_ns, 5) for s in samples]
    assert estimate_stage(intervals, flat) == StageEstimate({}, None, 0)
    backwards = [Interval(FWD, 1410, 10 * MS, 5 * MS)]
    assert estimate_stage(backwards, samples) == StageEstimate({}, None, 0)
    far = [Interval(FWD, 1410, samples[-1].t_ns + 10**9, samples[-1].t_ns + 2 * 10**9)]
    assert estimate_stage(far, samples).options == {}
    zero_length = [Interval(FWD, 1410, i.start_ns, i.start_ns) for i in intervals]
    assert estimate_stage(zero_length, samples).options == {}


def test_one_window_gives_an_estimate_with_unknown_error() -> None:
    intervals = pipeline_intervals(1, [1410])
    samples = counter_samples(intervals)
    first = samples[:3]  # the second window covers the first two forwards only
    estimate = estimate_stage(intervals, first, p_block_w=P_BLOCK_W)
    assert estimate.windows == 1
    (option,) = estimate.options.values()
    assert option.energy_j == pytest.approx(400.0 * 0.030, rel=1e-3)
    assert math.isinf(option.energy_rel_err)
    assert estimate_stage(intervals, first).options == {}


def test_indistinguishable_groups_are_left_out() -> None:
    # Forward and backward always run back to back in a fixed ratio: only their sum is determined.
    intervals: list[Interval] = []
    t_ns = 1_000 * MS
    for _ in range(40):
        intervals.append(Interval(FWD, 1410, t_ns, t_ns + 30 * MS))
        intervals.append(Interval(BWD, 1410, t_ns + 30 * MS, t_ns + 85 * MS))
        t_ns += 100 * MS
    samples = [CounterSample(1_000 * MS + k * 100 * MS, 1000 + k * 40_000) for k in range(41)]
    estimate = estimate_stage(intervals, samples, p_block_w=P_BLOCK_W)
    assert estimate.windows == 39
    assert estimate.options == {}
    alone = estimate_stage([i for i in intervals if i.key == FWD], samples, p_block_w=P_BLOCK_W)
    assert set(alone.options) == {(FWD, 1410)}


def test_windows_over_blind_computations_are_dropped() -> None:
    """Computations that ran but are not intervals (they began before their clock applied) are unknown
    energy: as blind spans, every window over them goes, and the rest give the exact powers."""
    intervals = pipeline_intervals(6, [1410])
    samples = counter_samples(intervals)
    hidden = [i for n, i in enumerate(intervals) if n % 16 < 2]  # each iteration's first two, as after a lock
    kept = [i for i in intervals if i not in hidden]
    spans = [(i.start_ns, i.end_ns) for i in hidden]
    clean = estimate_stage(kept, samples, p_block_w=P_BLOCK_W, blind=spans)
    for key in (FWD, BWD):
        true_j = POWERS_W[(key, 1410)] * clean.options[(key, 1410)].time_s
        assert clean.options[(key, 1410)].energy_j == pytest.approx(true_j, rel=1e-3)
    everything = [(intervals[0].start_ns, intervals[-1].end_ns)]
    assert estimate_stage(kept, samples, p_block_w=P_BLOCK_W, blind=everything).options == {}


def _back_to_back(iterations: int, seed: int) -> tuple[list[Interval], list[Interval]]:
    """A last pipeline stage: each microbatch's forward and backward run back to back. Returns the true
    intervals and the ones the daemon sees, each event stamped up to a few tenths of a ms late (exponential,
    mean 0.5 ms: a training process's wake-up and event delivery)."""
    rng = random.Random(seed)
    true, seen = [], []
    t_ns = 1_000 * MS
    for _ in range(iterations):
        t_ns += 60 * MS  # the bubble before the steady phase
        for _microbatch in range(8):
            for key, length_ns in ((FWD, 9 * MS), (BWD, 17 * MS + MS // 2)):
                true.append(Interval(key, 1410, t_ns, t_ns + length_ns))
                late_begin_ns, late_end_ns = (round(rng.expovariate(2.0 / MS)) for _ in range(2))
                seen.append(Interval(key, 1410, t_ns + late_begin_ns, t_ns + length_ns + late_end_ns))
                t_ns += length_ns + MS // 5
    return true, seen


def test_back_to_back_computations_are_split_well_despite_late_events() -> None:
    # Their split comes only from where the counter windows' edges fall, so timing noise moves it; the
    # same-clock power prior keeps it near the truth (without it: mean 10 %, worst 20 % off, forwards low).
    errors = []
    for seed in range(8):
        true, seen = _back_to_back(12, seed)
        estimate = estimate_stage(seen, counter_samples(true, noise=0.01), p_block_w=P_BLOCK_W)
        forward = estimate.options[(FWD, 1410)]
        errors.append(abs(forward.energy_j / (POWERS_W[(FWD, 1410)] * 0.009) - 1))
    assert sum(errors) / len(errors) < 0.06
    assert max(errors) < 0.15


def _one_stage(iterations: int, *, gap_ns: int, long_every: int = 0) -> list[Interval]:
    """A one-stage job: forward and backward back to back, `gap_ns` idle between
    iterations; with `long_every`, every such forward runs 1.5x longer (the GPU busy all the while)."""
    intervals: list[Interval] = []
    t_ns = 1_000 * MS
    count = 0
    for _ in range(iterations):
        for _microbatch in range(8):
            count += 1
            stretch = 1.5 if long_every and count % long_every == 0 else 1.0
            for key, length_ns in ((FWD, round(9 * MS * stretch)), (BWD, 17 * MS)):
                intervals.append(Interval(key, 1410, t_ns, t_ns + length_ns))
                t_ns += length_ns
        t_ns += gap_ns
    return intervals


def test_a_long_computation_followed_at_once_by_the_next_keeps_its_windows() -> None:
    # A real GPU's computations vary by more than the time-outlier limit; one that ran long but was followed
    # at once by the next hid no idle time, so the windows over it are fitted (dropping them left 7-11 of
    # 20-25 windows on an H200).
    intervals = _one_stage(10, gap_ns=MS, long_every=7)
    samples = counter_samples(intervals)
    estimate = estimate_stage(intervals, samples, p_block_w=P_BLOCK_W)
    forward = estimate.options[(FWD, 1410)]
    assert forward.count < sum(1 for i in intervals if i.key == FWD)  # the long ones are time outliers
    assert estimate.windows >= len(samples) - 4
    for key in (FWD, BWD):
        option = estimate.options[(key, 1410)]
        assert option.energy_j == pytest.approx(POWERS_W[(key, 1410)] * option.time_s, rel=1e-3)


def test_a_segment_with_little_idle_time_uses_the_fallback_blocking_power() -> None:
    intervals = _one_stage(12, gap_ns=MS // 2)
    samples = [  # a segment within a run: busy before and after it
        s
        for s in counter_samples(intervals, noise=0.01)
        if intervals[0].start_ns <= s.t_ns <= intervals[-1].end_ns
    ]
    own = estimate_stage(intervals, samples)
    assert own.p_block_err_w > 0.25 * P_BLOCK_W  # 0.2 % idle time cannot pin it down
    estimate = estimate_segment(intervals, samples, fallback_p_block_w=P_BLOCK_W)
    assert estimate.p_block_w == P_BLOCK_W
    assert estimate.measured_p_block_w is None  # a stand-in, not a measurement of this clock's waits
    first = estimate_segment(intervals, samples)  # the first segment: a nominal idle share of the least power
    least_w = min(o.energy_j / o.time_s for o in own.options.values())
    assert first.p_block_w == pytest.approx(NOMINAL_IDLE_SHARE * least_w)
    true_j = sum(POWERS_W[key] * option.time_s for key, option in first.options.items())
    assert sum(o.energy_j for o in first.options.values()) == pytest.approx(true_j, rel=0.02)


def test_a_segment_with_bubbles_regresses_its_own_blocking_power_below_the_fallback() -> None:
    intervals = _one_stage(12, gap_ns=60 * MS)
    samples = counter_samples(intervals, noise=0.002)
    own = estimate_segment(intervals, samples, fallback_p_block_w=120.0)
    assert own.p_block_w == pytest.approx(P_BLOCK_W, rel=0.05)
    assert own.measured_p_block_w == own.p_block_w
    # Idle power falls with the clock, and segments run from the highest clock down: never above the first's.
    bounded = estimate_segment(intervals, samples, fallback_p_block_w=60.0)
    assert bounded.p_block_w == 60.0
    assert bounded.measured_p_block_w is None


def test_a_segment_falls_back_on_the_least_blocking_power_measured_above_it() -> None:
    """Idle power falls with the clock and segments run from the highest clock down: the least measured above
    a segment bounds its own from above more closely than the first segment's."""
    assert segment_stand_in_w(None, []) is None  # the first segment: its nominal share instead
    assert segment_stand_in_w(128.7, []) == 128.7  # nothing measured yet: the first segment's
    assert segment_stand_in_w(128.7, [128.7, 111.0, 93.0]) == 93.0
    intervals = _one_stage(12, gap_ns=MS // 2)
    samples = [
        s
        for s in counter_samples(intervals, noise=0.01)
        if intervals[0].start_ns <= s.t_ns <= intervals[-1].end_ns
    ]
    stood_in = estimate_segment(intervals, samples, fallback_p_block_w=2 * P_BLOCK_W, stand_in_w=P_BLOCK_W)
    assert stood_in.p_block_w == P_BLOCK_W  # too little idle time: the stand-in, not the first segment's
    assert stood_in.measured_p_block_w is None


def test_the_first_segments_blocking_power_bounds_a_segment_not_the_stand_in() -> None:
    """One noisy low measurement above must not cap every segment below it: a segment that measures its own
    keeps it above the stand-in, within the first segment's bound."""
    intervals = _one_stage(12, gap_ns=60 * MS)
    samples = counter_samples(intervals, noise=0.002)
    own = estimate_segment(intervals, samples, fallback_p_block_w=120.0, stand_in_w=0.8 * P_BLOCK_W)
    assert own.p_block_w == pytest.approx(P_BLOCK_W, rel=0.05)
    assert own.measured_p_block_w == own.p_block_w

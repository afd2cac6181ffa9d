"""The power ramp bound (`perseusd.planner.ramp_bound`): checked against the node's held power sampled every
10 ms at random grid phases and random alignments of its GPUs, on random profiles, plans and bounds."""

from __future__ import annotations

import bisect
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.evaluate import all_max_clocks, longest_path_s, measurements_for
from perseusd.planner.profile import Profile
from perseusd.planner.ramp_bound import (
    SAMPLE_S,
    bound_gpu_ramps,
    bound_ramps,
    plan_ramp_w_per_s,
    power_w,
)
from tests.support.synthetic import synthetic_profile

CLOCKS_MHZ = tuple(range(1410, 885, -45))
Case = tuple[ComputationDag, Profile, list[int], list[int], float, int]
"""What `cases` draws: a DAG, its profile, a plan's clocks, GPUs per stage, a bound (W/s), an rng seed."""


def _held_energy(
    starts: list[float], powers: list[float], period_s: float
) -> tuple[list[float], list[float], float]:
    """One GPU's held power over one period from its first start: breakpoints, cumulative energy, offset."""
    t0 = starts[0]
    times = [s - t0 for s in starts] + [period_s]
    cumulative = [0.0]
    for i, p in enumerate(powers):
        cumulative.append(cumulative[-1] + p * (times[i + 1] - times[i]))
    return times, cumulative, t0


def _energy_until(curve: tuple[list[float], list[float], float], powers: list[float], t: float) -> float:
    times, cumulative, t0 = curve
    period_s = times[-1]
    whole, rest = divmod(t - t0, period_s)
    i = max(0, bisect.bisect_right(times, rest) - 1)
    i = min(i, len(powers) - 1)
    return whole * cumulative[-1] + cumulative[i] + powers[i] * (rest - times[i])


def sampled_node_changes_w(
    dag: ComputationDag, profile: Profile, clocks: list[int], weights: list[int], seed: int
) -> list[float]:
    """Changes between consecutive 10 ms averages of the node's held power (each GPU at its current
    computation's power until its next starts), each GPU at a random offset, over two iterations."""
    rows = measurements_for(dag, profile, clocks)
    durations = [m.time_s for m in rows]
    finish = [0.0] * dag.num_computations
    start = [0.0] * dag.num_computations
    for node in dag.topological_order:
        start[node] = max((finish[p] for p in dag.predecessors[node]), default=0.0)
        finish[node] = start[node] + durations[node]
    period_s = max(finish)
    rng = random.Random(seed)
    gpus = []
    for stage, nodes in enumerate(dag.stage_orders):
        powers = [power_w(rows[n]) for n in nodes]
        curve = _held_energy([start[n] for n in nodes], powers, period_s)
        gpus += [(curve, powers, rng.uniform(0, period_s))] * weights[stage]
    phase = rng.uniform(0, SAMPLE_S)
    edges = [phase + k * SAMPLE_S for k in range(int(2 * period_s / SAMPLE_S) + 2)]
    samples = []
    for a, b in itertools.pairwise(edges):
        energy = sum(_energy_until(c, p, b + o) - _energy_until(c, p, a + o) for c, p, o in gpus)
        samples.append(energy / SAMPLE_S)
    return [b - a for a, b in itertools.pairwise(samples)]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    stages = draw(st.integers(2, 4))
    dag = build_dag(draw(st.sampled_from(("1f1b", "gpipe"))), stages, draw(st.integers(1, 6)))
    base_time_s = draw(st.sampled_from((0.002, 0.006, 0.02)))  # short computations: several steps in 20 ms
    profile = synthetic_profile(
        stages, draw(st.integers(0, 10**6)), clocks_mhz=CLOCKS_MHZ, base_time_s=base_time_s
    )
    seed = draw(st.integers(0, 10**6))
    rng = random.Random(seed)
    clocks = [rng.choice(CLOCKS_MHZ) for _ in range(dag.num_computations)]
    weights = [draw(st.integers(0, 3)) for _ in range(stages)]
    planned = plan_ramp_w_per_s(dag, profile, clocks, weights)
    limit = planned * draw(st.floats(0.01, 1.2)) + 1.0
    return dag, profile, clocks, weights, limit, seed


@settings(max_examples=60, deadline=None)
@given(cases())
def test_the_bound_holds_at_every_10ms_sample_and_the_iteration_never_slows(case: Case) -> None:
    dag, profile, clocks, weights, limit, seed = case
    result = bound_ramps(dag, profile, clocks, limit, weights)
    bounded = list(result.clocks_mhz)
    assert all(b >= c for b, c in zip(bounded, clocks, strict=True))  # only ever raised
    before = longest_path_s(dag, [m.time_s for m in measurements_for(dag, profile, clocks)])
    after = longest_path_s(dag, [m.time_s for m in measurements_for(dag, profile, bounded)])
    assert after <= before * (1 + 1e-12)
    top_ramp = plan_ramp_w_per_s(dag, profile, all_max_clocks(dag, profile), weights)
    if top_ramp <= limit:  # all-max holds it: so does the bounded plan
        assert result.met
    assert result.ramp_w_per_s == pytest.approx(plan_ramp_w_per_s(dag, profile, bounded, weights))
    if result.met:
        assert result.ramp_w_per_s <= limit * (1 + 1e-9)
        for trial in range(3):
            changes = sampled_node_changes_w(dag, profile, bounded, weights, seed + trial)
            assert max(abs(c) for c in changes) / SAMPLE_S <= limit * (1 + 1e-6)
    for stage, nodes in enumerate(dag.stage_orders):  # a stage not run here is never touched
        if weights[stage] == 0:
            assert [bounded[n] for n in nodes] == [clocks[n] for n in nodes]


@settings(max_examples=40, deadline=None)
@given(cases())
def test_each_gpu_held_to_its_slice_holds_any_node_made_of_them(case: Case) -> None:
    """The daemon's way: every GPU within bound / N alone, so any N of them (the weights) hold the bound."""
    dag, profile, clocks, weights, limit, seed = case
    per_gpu = limit / max(1, sum(weights))
    result = bound_gpu_ramps(dag, profile, clocks, per_gpu)
    bounded = list(result.clocks_mhz)
    assert all(b >= c for b, c in zip(bounded, clocks, strict=True))
    before = longest_path_s(dag, [m.time_s for m in measurements_for(dag, profile, clocks)])
    after = longest_path_s(dag, [m.time_s for m in measurements_for(dag, profile, bounded)])
    assert after <= before * (1 + 1e-12)
    each = [
        plan_ramp_w_per_s(dag, profile, bounded, [int(s == t) for t in range(dag.num_stages)])
        for s in range(dag.num_stages)
    ]
    assert result.ramp_w_per_s == pytest.approx(max(each))
    assert result.planned_ramp_w_per_s == pytest.approx(
        max(
            plan_ramp_w_per_s(dag, profile, clocks, [int(s == t) for t in range(dag.num_stages)])
            for s in range(dag.num_stages)
        )
    )
    top = all_max_clocks(dag, profile)
    if all(
        plan_ramp_w_per_s(dag, profile, top, [int(s == t) for t in range(dag.num_stages)]) <= per_gpu
        for s in range(dag.num_stages)
    ):
        assert result.met
    if result.met:
        assert max(each) <= per_gpu * (1 + 1e-9)
        changes = sampled_node_changes_w(dag, profile, bounded, weights, seed)
        assert max(abs(c) for c in changes) / SAMPLE_S <= per_gpu * sum(weights) * (1 + 1e-6) + 1e-6


@settings(max_examples=30, deadline=None)
@given(cases())
def test_a_bound_the_plan_already_holds_changes_nothing(case: Case) -> None:
    dag, profile, clocks, weights, _limit, _seed = case
    planned = plan_ramp_w_per_s(dag, profile, clocks, weights)
    for limit in (max(planned, 1e-3), planned * 2 + 1, float("inf")):
        result = bound_ramps(dag, profile, clocks, limit, weights)
        assert list(result.clocks_mhz) == clocks
        assert result.raised == 0
        assert result.met
        assert result.planned_ramp_w_per_s == result.ramp_w_per_s == pytest.approx(planned)


def test_the_measure_is_what_10ms_samples_can_see() -> None:
    """A single GPU whose computations last 20 ms or more: its largest step between computations / 10 ms."""
    dag = build_dag("1f1b", 2, 3)
    profile = synthetic_profile(2, 5, clocks_mhz=CLOCKS_MHZ, base_time_s=0.03)
    clocks = [CLOCKS_MHZ[(3 * n) % len(CLOCKS_MHZ)] for n in range(dag.num_computations)]
    rows = measurements_for(dag, profile, clocks)
    largest = []
    for nodes in dag.stage_orders:
        powers = [power_w(rows[n]) for n in nodes]
        largest.append(max(abs(powers[i] - powers[i - 1]) for i in range(len(powers))))
    assert plan_ramp_w_per_s(dag, profile, clocks) == pytest.approx(sum(largest) / SAMPLE_S)
    assert plan_ramp_w_per_s(dag, profile, clocks, [2, 0]) == pytest.approx(2 * largest[0] / SAMPLE_S)


def test_a_bound_below_what_all_max_makes_is_reported_not_met() -> None:
    dag = build_dag("1f1b", 2, 4)
    profile = synthetic_profile(2, 7, clocks_mhz=CLOCKS_MHZ)
    top = all_max_clocks(dag, profile)
    floor_w_per_s = plan_ramp_w_per_s(dag, profile, top)
    assert floor_w_per_s > 0
    result = bound_ramps(dag, profile, top, floor_w_per_s / 2)  # no clock left to raise
    assert not result.met
    assert list(result.clocks_mhz) == top
    assert result.ramp_w_per_s == pytest.approx(floor_w_per_s)


@pytest.mark.parametrize("limit", [0.0, -5.0, float("nan")])
def test_a_limit_that_is_no_ramp_is_refused(limit: float) -> None:
    dag = build_dag("1f1b", 2, 2)
    profile = synthetic_profile(2, 1, clocks_mhz=CLOCKS_MHZ)
    with pytest.raises(ValueError, match="positive"):
        bound_ramps(dag, profile, all_max_clocks(dag, profile), limit)
    with pytest.raises(ValueError, match="one count >= 0 per stage"):
        bound_ramps(dag, profile, all_max_clocks(dag, profile), 1000.0, [1])

"""Baselines follow their definitions on small synthetic profiles and on the real A100 profile."""

from __future__ import annotations

import itertools

import pytest

from perseusd.planner.baselines import (
    CandidatePoint,
    all_max,
    common_clocks_mhz,
    pareto_subset,
    zeus_global,
    zeus_global_select,
    zeus_global_sweep,
    zeus_per_stage,
    zeus_per_stage_sweep,
)
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import Instruction, build_dag
from perseusd.planner.envpipe import (
    critical_path,
    envelope_nodes,
    envpipe,
    envpipe_run,
    initial_clocks,
)
from perseusd.planner.evaluate import all_max_clocks, evaluate_clocks, longest_path_s
from perseusd.planner.profile import Measurement, Profile
from tests.planner.periphery_profiles import CLOCKS_MHZ, shaped_profile

P_BLOCK_W = 60.0
HEAVY_LAST = shaped_profile([1.0, 1.3, 1.2, 1.4])
LIGHT_LAST = shaped_profile([1.0, 1.6, 1.1, 0.7])


def test_all_max_is_the_evaluation_at_max_clocks() -> None:
    dag = build_dag("1f1b", 4, 6)
    point = all_max(dag, HEAVY_LAST, P_BLOCK_W)
    expected = evaluate_clocks(dag, HEAVY_LAST, all_max_clocks(dag, HEAVY_LAST), P_BLOCK_W)
    assert (point.time_s, point.energy_j) == (expected.time_s, expected.energy_j)
    assert set(point.clocks_mhz) == {max(CLOCKS_MHZ)}


def test_pareto_subset() -> None:
    points = [
        CandidatePoint(t, e, ()) for t, e in [(3.0, 5.0), (1.0, 9.0), (2.0, 9.5), (2.0, 7.0), (4.0, 6.0)]
    ]
    assert [(p.time_s, p.energy_j) for p in pareto_subset(points)] == [(1.0, 9.0), (2.0, 7.0), (3.0, 5.0)]


def test_zeus_global_sweeps_one_clock_for_everything() -> None:
    dag = build_dag("1f1b", 4, 6)
    sweep = zeus_global_sweep(dag, HEAVY_LAST, P_BLOCK_W)
    assert [p.clocks_mhz[0] for p in sweep] == list(CLOCKS_MHZ)
    for point in sweep:
        assert len(set(point.clocks_mhz)) == 1
        expected = evaluate_clocks(dag, HEAVY_LAST, point.clocks_mhz, P_BLOCK_W)
        assert point.energy_j == expected.energy_j
    frontier = zeus_global(dag, HEAVY_LAST, P_BLOCK_W)
    assert frontier == pareto_subset(sweep)
    assert 1 < len(frontier) < len(sweep)  # convex energy: the lowest clocks cost more and are dropped
    assert frontier[0] == all_max(dag, HEAVY_LAST, P_BLOCK_W)


def test_zeus_global_with_one_clock_is_all_max() -> None:
    dag = build_dag("1f1b", 3, 4)
    profile = shaped_profile([1.0, 1.2, 0.8], clocks_mhz=(1410,))
    assert zeus_global(dag, profile, P_BLOCK_W) == [all_max(dag, profile, P_BLOCK_W)]


def test_zeus_global_uses_only_clocks_common_to_every_stage() -> None:
    rows = list(shaped_profile([1.0, 1.2]).measurements)
    rows = [
        m for m in rows if not (m.stage == 1 and m.instruction is Instruction.BACKWARD and m.freq_mhz == 1320)
    ]
    profile = Profile.from_measurements(rows)
    dag = build_dag("1f1b", 2, 3)
    assert 1320 not in common_clocks_mhz(dag, profile)
    assert len(zeus_global_sweep(dag, profile, 0.0)) == len(CLOCKS_MHZ) - 1


def test_zeus_global_selection() -> None:
    points = [CandidatePoint(1.0, 10.0, ()), CandidatePoint(1.5, 8.0, ()), CandidatePoint(3.0, 7.5, ())]
    assert zeus_global_select(points, eta=1.0, num_gpus=4, p_max_w=300.0) == points[2]
    assert zeus_global_select(points, eta=0.0, num_gpus=4, p_max_w=300.0) == points[0]
    # eta = 0.5, W*P_max = 2: costs 0.5*E + 0.5*2*T = 6.0, 5.5, 6.75
    assert zeus_global_select(points, eta=0.5, num_gpus=1, p_max_w=2.0) == points[1]


def test_zeus_per_stage_matches_forward_times_of_the_heaviest_stage() -> None:
    dag = build_dag("1f1b", 4, 6)
    profile = LIGHT_LAST  # stage 1 is the heaviest
    sweep = zeus_per_stage_sweep(dag, profile, P_BLOCK_W)
    assert len(sweep) == len(CLOCKS_MHZ)
    for f_h, point in zip(CLOCKS_MHZ, sweep, strict=True):
        per_stage = {dag.computations[n].stage: point.clocks_mhz[n] for n in range(dag.num_computations)}
        assert all(point.clocks_mhz[n] == per_stage[c.stage] for n, c in enumerate(dag.computations))
        assert per_stage[1] == f_h
        target_s = profile.lookup(1, Instruction.FORWARD, f_h).time_s
        for stage in (0, 2, 3):
            gaps = {
                f: abs(profile.lookup(stage, Instruction.FORWARD, f).time_s - target_s) for f in CLOCKS_MHZ
            }
            assert gaps[per_stage[stage]] == min(gaps.values())
        assert per_stage[3] <= per_stage[0] <= per_stage[2] <= f_h  # lighter stages get lower clocks
    assert zeus_per_stage(dag, profile, P_BLOCK_W) == pareto_subset(sweep)


def test_zeus_per_stage_on_identical_stages_is_zeus_global() -> None:
    dag = build_dag("1f1b", 3, 4)
    profile = shaped_profile([1.0, 1.0, 1.0])
    assert zeus_per_stage(dag, profile, P_BLOCK_W) == zeus_global(dag, profile, P_BLOCK_W)


def test_envelope_of_1f1b() -> None:
    dag = build_dag("1f1b", 3, 4)
    envelope = envelope_nodes(dag)
    labels = {dag.computations[n].label() for n in envelope}
    last_stage = {f"{i}{j}@s2" for i in "FB" for j in range(4)}
    assert labels == last_stage | {"F0@s0", "B3@s0", "F0@s1", "B3@s1"}


def test_envpipe_starts_at_minimum_energy_off_the_envelope() -> None:
    dag = build_dag("1f1b", 4, 6)
    clocks = initial_clocks(dag, HEAVY_LAST)
    envelope = envelope_nodes(dag)
    for node, comp in enumerate(dag.computations):
        if node in envelope:
            assert clocks[node] == max(CLOCKS_MHZ)
        else:
            options = HEAVY_LAST.options(comp.stage, comp.instruction)
            assert clocks[node] == min(options, key=lambda m: m.energy_j).freq_mhz
            assert max(CLOCKS_MHZ) > clocks[node] > min(CLOCKS_MHZ)  # convex energy: a middle clock


def test_envpipe_reaches_the_envelope_when_the_last_stage_is_heaviest() -> None:
    dag = build_dag("1f1b", 4, 8)
    result = envpipe_run(dag, HEAVY_LAST, P_BLOCK_W)
    baseline = all_max(dag, HEAVY_LAST, P_BLOCK_W)
    assert result.reached_envelope
    assert result.iterations > 0
    # The final critical path is the envelope at max clocks, which is also all-max's critical path.
    assert result.point.time_s == pytest.approx(baseline.time_s, rel=1e-12)
    assert result.point.energy_j < baseline.energy_j
    assert envpipe(dag, HEAVY_LAST, P_BLOCK_W) == [result.point]


def test_envpipe_stops_without_progress_when_the_last_stage_is_light() -> None:
    dag = build_dag("1f1b", 4, 8)
    result = envpipe_run(dag, LIGHT_LAST, P_BLOCK_W)
    assert not result.reached_envelope
    times = [
        LIGHT_LAST.lookup(dag.virtual_stage(n), c.instruction, result.point.clocks_mhz[n]).time_s
        for n, c in enumerate(dag.computations)
    ]
    path = critical_path(dag, times)
    assert not set(path) <= envelope_nodes(dag)
    assert all(result.point.clocks_mhz[n] == max(CLOCKS_MHZ) for n in path)  # nothing left to raise
    # Times fall monotonically with the clock, so a critical path at max clocks is all-max's time.
    assert result.point.time_s == pytest.approx(all_max(dag, LIGHT_LAST, P_BLOCK_W).time_s, rel=1e-12)


def test_envpipe_iterations_are_bounded() -> None:
    dag = build_dag("1f1b", 4, 8)
    assert envpipe_run(dag, LIGHT_LAST, P_BLOCK_W, max_iterations=2).iterations == 2
    steps = sum(len(CLOCKS_MHZ) for _ in range(dag.num_computations))
    assert envpipe_run(dag, LIGHT_LAST, P_BLOCK_W).iterations <= steps


def test_critical_path_follows_the_longest_chain() -> None:
    dag = build_dag("1f1b", 2, 2)
    durations = [1.0 + 0.1 * n for n in range(dag.num_computations)]
    path = critical_path(dag, durations)
    assert sum(durations[n] for n in path) == pytest.approx(longest_path_s(dag, durations))
    for u, v in itertools.pairwise(path):
        assert v in dag.successors[u]
    assert dag.predecessors[path[0]] == ()
    assert dag.successors[path[-1]] == ()


def test_real_profile_baselines() -> None:
    dag = build_dag("1f1b", 8, 12)
    profile = bundled_profile("a100_sxm")
    baseline = all_max(dag, profile, 83.64)
    result = envpipe_run(dag, profile, 83.64)
    assert result.reached_envelope  # stage 7 is the heaviest in this profile
    assert 0.10 < 1 - result.point.energy_j / baseline.energy_j < 0.20
    global_frontier = zeus_global(dag, profile, 83.64)
    assert global_frontier[0] == baseline
    per_stage = zeus_per_stage(dag, profile, 83.64)
    assert all(p.energy_j < baseline.energy_j for p in per_stage)


def test_single_measurement_profile() -> None:
    profile = Profile.from_measurements(
        [
            Measurement(0, Instruction.FORWARD, 1000, 0.01, 1.0),
            Measurement(0, Instruction.BACKWARD, 1000, 0.02, 2.0),
        ]
    )
    dag = build_dag("1f1b", 1, 3)
    baseline = all_max(dag, profile, 10.0)
    assert envpipe(dag, profile, 10.0) == [baseline]
    assert zeus_per_stage(dag, profile, 10.0) == [baseline]

"""Accuracy against the simulated GPUs' ground truth: a pipeline stage runs on the real simulated GPU (energy
counter updated every 100 ms with 1 % noise, read every ~10 ms) and every kept estimate must be within 2 % in
time and 3 % in energy of the model's profile; the regressed blocking power within 5 %."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perseusd.profiling.estimator import StageEstimate, estimate_stage
from perseusd.profiling.sweep import StageSweep, SweepSettings
from perseusd.profiling.trace import OptionKey
from tests.profiling.emulation import StageEmulator

TIME_TOLERANCE = 0.02
ENERGY_TOLERANCE = 0.03
P_BLOCK_TOLERANCE = 0.05


@pytest.fixture
def make_stage(tmp_path: Path) -> Iterator[Callable[..., StageEmulator]]:
    made: list[StageEmulator] = []

    def make(**kwargs: Any) -> StageEmulator:
        emulator = StageEmulator(tmp_path / f"sim{len(made)}", **kwargs)
        made.append(emulator)
        return emulator

    yield make
    for emulator in made:
        emulator.close()


def sweep_to_the_end(stage: StageEmulator, settings: SweepSettings) -> tuple[StageSweep, StageEstimate]:
    """Profile as the daemon will: one clock per iteration, the sweep deciding, re-estimating each time."""
    sweep = StageSweep(stage.model.clocks_mhz, stage.keys, settings)
    estimate = StageEstimate({}, None, 0)
    while (clock := sweep.current_clock_mhz) is not None:
        stage.run_iteration(clock)
        estimate = estimate_stage(stage.intervals, stage.trace.samples())
        sweep.iteration_done(estimate)
    return sweep, estimate


def assert_p_block_close(stage: StageEmulator, estimate: StageEstimate) -> None:
    truth_w = stage.model.board.blocking_power_w
    assert estimate.p_block_w is not None
    assert estimate.p_block_w == pytest.approx(truth_w, rel=P_BLOCK_TOLERANCE)


@pytest.mark.parametrize("model", ["a100_sxm", "a40"])
@pytest.mark.parametrize("stage_index", [0, 7])
@pytest.mark.parametrize("time_scale", [0.25, 1.0])
def test_every_kept_estimate_matches_the_profile(
    make_stage: Callable[..., StageEmulator], model: str, stage_index: int, time_scale: float
) -> None:
    stage = make_stage(
        model=model, num_stages=8, num_microbatches=12, stage=stage_index, time_scale=time_scale
    )
    sweep, estimate = sweep_to_the_end(stage, SweepSettings(clock_stride=6))
    kept = sweep.kept(estimate)
    assert {o.key for o in kept} == set(stage.keys)
    assert {o.clock_mhz for o in kept} >= {stage.model.clocks_mhz[0]}
    for option in kept:
        truth = stage.model.cost(option.key[0], option.key[1], option.clock_mhz)
        assert option.count >= 8
        assert option.time_s == pytest.approx(truth.time_s * time_scale, rel=TIME_TOLERANCE)
        assert option.energy_j == pytest.approx(truth.energy_j * time_scale, rel=ENERGY_TOLERANCE), option
    assert_p_block_close(stage, estimate)


def measured_truth(stage: StageEmulator) -> dict[tuple[OptionKey, int], tuple[float, float]]:
    """Mean recorded time and energy per (key, clock) of the computations the simulated GPU really ran."""
    runs: dict[tuple[OptionKey, int], list[tuple[float, float]]] = defaultdict(list)
    for record in stage.records:
        runs[((record.stage, record.instruction), record.clock_mhz)].append(
            (record.duration_s, record.energy_j)
        )
    return {
        group: (sum(t for t, _ in values) / len(values), sum(e for _, e in values) / len(values))
        for group, values in runs.items()
    }


def assert_matches_records(stage: StageEmulator, estimate: StageEstimate) -> None:
    truth = measured_truth(stage)
    assert set(estimate.options) == set(truth)
    for group, option in estimate.options.items():
        time_s, energy_j = truth[group]
        assert option.time_s == pytest.approx(time_s, rel=TIME_TOLERANCE)
        assert option.energy_j == pytest.approx(energy_j, rel=ENERGY_TOLERANCE), option


def test_computations_that_vary_in_length_get_their_mean_cost(
    make_stage: Callable[..., StageEmulator],
) -> None:
    stage = make_stage(model="a100_sxm", num_stages=8, num_microbatches=12, stage=3, time_scale=0.5, seed=4)
    factors = [0.75, 1.3, 0.9, 1.15, 1.05, 0.8, 1.2, 0.95]
    for clock in (1410, 1200, 990):
        for _ in range(4):
            stage.run_iteration(clock, vary=lambda index: factors[index % len(factors)])
    estimate = estimate_stage(stage.intervals, stage.trace.samples())
    assert_matches_records(stage, estimate)
    spread = {record.duration_s for record in stage.records if record.clock_mhz == 1410}
    assert max(spread) / min(spread) > 1.5
    assert_p_block_close(stage, estimate)


def test_interleaved_chunks_are_separate_keys_on_one_gpu(make_stage: Callable[..., StageEmulator]) -> None:
    stage = make_stage(
        model="a40", num_stages=4, num_microbatches=8, num_chunks=2, stage=3, time_scale=0.5, seed=2
    )
    assert stage.keys == [(3, "backward"), (3, "forward"), (7, "backward"), (7, "forward")]
    for clock in (1740, 1395, 1110):
        for _ in range(4):
            stage.run_iteration(clock)
    estimate = estimate_stage(stage.intervals, stage.trace.samples())
    assert len(estimate.options) == 12
    assert_matches_records(stage, estimate)
    assert_p_block_close(stage, estimate)


def test_a_known_blocking_power_is_used(make_stage: Callable[..., StageEmulator]) -> None:
    stage = make_stage(model="a40", num_stages=8, num_microbatches=12, stage=0, time_scale=0.25)
    for clock in (1740, 1200):
        for _ in range(3):
            stage.run_iteration(clock)
    p_block_w = stage.model.board.blocking_power_w
    estimate = estimate_stage(stage.intervals, stage.trace.samples(), p_block_w=p_block_w)
    assert estimate.p_block_w == p_block_w
    assert_matches_records(stage, estimate)

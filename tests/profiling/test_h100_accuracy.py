"""Online profiling on the simulated H100 board against the real H100's ground truth.

Each of the 4 stages of the GPT pipeline runs on the simulated `h100_sxm` board (power capping, a 100 ms
energy counter with 1 % noise per update, idle power that follows the locked clock) on a fake clock, and is
profiled as the daemon profiles it: the daemon's sweep settings and iteration budget, one estimate per
clock segment with its own blocking power, the capped clock passed on at the highest clock. Every option the
profile keeps is compared with `gpt-4stage-sweep.json` (windows of at least 1 s at locked clocks, measured on
a real H100; linear between its rows, 45 MHz apart, as the simulated board is).

Honest limits: the simulated board is driven by the shipped profile, which comes from that same sweep, so
this measures the profiling METHOD (clock choice, the counter regression, capping), not a real GPU's noise.
The board caps each computation on its own (a backward drawing over 700 W runs at a lower clock), where the
real GPU capped forward+backward together; where the board's cost differs from the sweep for that reason,
the option is compared with what the board really ran instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perseusd.gpu.sim_boards import load_board
from perseusd.profiling.estimator import OptionEstimate, StageEstimate, estimate_segment, segment_stand_in_w
from perseusd.profiling.sweep import ONLINE_SWEEP, StageSweep, SweepSettings
from perseusd.profiling.trace import OptionKey
from tests.profiling.emulation import StageEmulator
from tests.support.reference_data import H100

SWEEP_JSON = H100 / "gpt-4stage-sweep.json"
TIME_TOLERANCE = 0.02
ENERGY_TOLERANCE = 0.03
MAX_ITERATIONS = 78
"""The issue's 80, less the daemon's 2 warm-up iterations."""
SETTINGS = SweepSettings(iteration_budget=40, **ONLINE_SWEEP)
Cost = tuple[float, float]


def ground_truth() -> dict[tuple[int, str, int], Cost]:
    """(stage, forward/backward, clock) -> (time s, energy J) per computation; backward = fwdbwd - forward."""
    rows = json.loads(SWEEP_JSON.read_text(encoding="utf-8"))
    raw = {(r["stage"], r["what"], r["clock"]): (float(r["time"]), float(r["energy"])) for r in rows}
    truth: dict[tuple[int, str, int], Cost] = {}
    for (stage, what, clock), (time_s, energy_j) in raw.items():
        if what == "forward":
            truth[(stage, "forward", clock)] = (time_s, energy_j)
            both_s, both_j = raw[(stage, "fwdbwd", clock)]
            truth[(stage, "backward", clock)] = (both_s - time_s, both_j - energy_j)
    return truth


def truth_at(truth: dict[tuple[int, str, int], Cost], key: OptionKey, clock_mhz: int) -> Cost:
    """The ground truth at any clock of its range: linear between the sweep's clocks."""
    clocks = sorted({c for (s, i, c) in truth if (s, i) == key})
    if clock_mhz in clocks:
        return truth[(*key, clock_mhz)]
    low = max(c for c in clocks if c < clock_mhz)
    high = min(c for c in clocks if c > clock_mhz)
    weight = (clock_mhz - low) / (high - low)
    (t0, e0), (t1, e1) = truth[(*key, low)], truth[(*key, high)]
    return t0 + weight * (t1 - t0), e0 + weight * (e1 - e0)


@dataclass(frozen=True)
class Profiled:
    iterations: int
    kept: list[OptionEstimate]
    ran: dict[tuple[OptionKey, int], Cost]
    """Mean time and energy of the computations the board ran, per (key, locked clock)."""
    board_capped: set[tuple[OptionKey, int]]
    """Options whose computations the board capped below their lock."""
    estimate: StageEstimate | None = None
    """The last estimate (every measured option)."""
    sweep_clocks_mhz: tuple[int, ...] = ()
    waiting_w: dict[int, float] | None = None
    """Each finished segment's blocking power, by its clock (what the daemon keeps as the waiting power)."""


def profile_stage(stage: StageEmulator) -> Profiled:
    """The daemon's procedure (`ProfilingRun._measure_iteration`) on the fake clock."""
    sweep = StageSweep(stage.model.clocks_mhz, stage.keys, SETTINGS)
    done: dict[tuple[OptionKey, int], OptionEstimate] = {}
    p_block_w: float | None = None
    segment_start = 0
    iterations = 0
    estimate = StageEstimate({}, None, 0)
    waiting_w: dict[int, float] = {}
    while (clock := sweep.current_clock_mhz) is not None and iterations < 300:
        first_record = len(stage.records)
        stage.run_iteration(clock)
        iterations += 1
        ran = stage.records[first_record:]
        # As the daemon reads the GPU: the highest clock it ran, when every computation was power-capped.
        all_capped = bool(ran) and all(r.capped for r in ran)
        intervals = stage.intervals[segment_start:]
        since_ns = intervals[0].start_ns - 20_000_000
        samples = [s for s in stage.trace.samples() if s.t_ns >= since_ns]
        stand_in_w = segment_stand_in_w(p_block_w, waiting_w.values())
        current = estimate_segment(intervals, samples, fallback_p_block_w=p_block_w, stand_in_w=stand_in_w)
        p_block_w = p_block_w if p_block_w is not None else current.p_block_w
        estimate = StageEstimate({**done, **current.options}, p_block_w, current.windows)
        capped_mhz = max(r.clock_mhz for r in ran) if all_capped and sweep.clocks_done == 0 else None
        sweep.iteration_done(estimate, capped_clock_mhz=capped_mhz)
        if sweep.current_clock_mhz != clock:
            done.update({k: v for k, v in current.options.items() if k[1] == clock})
            if (watts := current.measured_p_block_w) is not None:
                waiting_w[clock] = watts
            segment_start = len(stage.intervals)
    runs: dict[tuple[OptionKey, int], list[Cost]] = {}
    board_capped: set[tuple[OptionKey, int]] = set()
    for record, lock in zip(stage.records, stage.locks_mhz, strict=True):
        group = ((record.stage, record.instruction), lock)
        runs.setdefault(group, []).append((record.duration_s, record.energy_j))
        if record.capped:
            board_capped.add(group)
    ran = {g: (sum(t for t, _ in v) / len(v), sum(e for _, e in v) / len(v)) for g, v in runs.items()}
    kept = sweep.kept(estimate)
    return Profiled(iterations, kept, ran, board_capped, estimate, sweep.clocks_mhz, waiting_w)


@pytest.fixture
def stages() -> Iterator[list[StageEmulator]]:
    made: list[StageEmulator] = []
    yield made
    for stage in made:
        stage.close()


@pytest.mark.parametrize("microbatches", [8, 16])
def test_profiling_converges_within_the_error_bounds(
    tmp_path: Path, stages: list[StageEmulator], microbatches: int
) -> None:
    truth = ground_truth()
    worst_time = worst_energy = 0.0
    for index in range(4):
        stage = StageEmulator(
            tmp_path / f"s{index}", model="h100_sxm", num_stages=4, num_microbatches=microbatches, stage=index
        )
        stages.append(stage)
        profiled = profile_stage(stage)
        assert profiled.iterations <= MAX_ITERATIONS
        assert {o.key for o in profiled.kept} == set(stage.keys)
        assert len({o.clock_mhz for o in profiled.kept}) >= 3
        for option in profiled.kept:
            group = (option.key, option.clock_mhz)
            if group in profiled.board_capped:
                time_s, energy_j = profiled.ran[group]
            else:
                time_s, energy_j = truth_at(truth, option.key, option.clock_mhz)
            worst_time = max(worst_time, abs(option.time_s / time_s - 1))
            worst_energy = max(worst_energy, abs(option.energy_j / energy_j - 1))
            assert option.time_s == pytest.approx(time_s, rel=TIME_TOLERANCE), option
            assert option.energy_j == pytest.approx(energy_j, rel=ENERGY_TOLERANCE), option
    print(f"M={microbatches}: worst time error {worst_time:.4f}, worst energy error {worst_energy:.4f}")


def test_each_segment_measures_the_waiting_power_at_its_clock(
    tmp_path: Path, stages: list[StageEmulator]
) -> None:
    """The blocking power each clock's segment was estimated with is the board's idle power at that clock
    (72-130 W on `h100_sxm` over the clocks swept): what the daemon keeps as the job's waiting power by held
    clock."""
    board = load_board("h100_sxm")
    for index in range(4):
        stage = StageEmulator(
            tmp_path / f"s{index}", model="h100_sxm", num_stages=4, num_microbatches=8, stage=index
        )
        stages.append(stage)
        waiting_w = profile_stage(stage).waiting_w or {}
        assert len(waiting_w) >= 3
        for (
            clock_mhz,
            watts,
        ) in waiting_w.items():  # seed 0: within 8 % (stage 1 at 1980 MHz), most within 3 %
            assert watts == pytest.approx(board.idle_power_w(clock_mhz), rel=0.10), (index, clock_mhz)

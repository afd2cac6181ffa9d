"""`benchmarks/bench_closed_loop.py`'s references: the planner's no-slowdown saving on the shipped profile and
on the board's effective (power-capped) costs, and the measured saving as a share of each."""

from __future__ import annotations

import io
import itertools

import pytest

from benchmarks.bench_closed_loop import board_effective_profile, board_true_profile, summary
from benchmarks.closed_loop_suite import family_csv
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import read_profile_stream


def test_the_board_runs_capped_rows_at_a_lower_clock_and_others_as_shipped() -> None:
    shipped = bundled_profile("h100_sxm")
    effective = board_effective_profile(shipped, "h100_sxm")
    limit_w = load_board("h100_sxm").power_limit_default_w
    changed = 0
    for m in shipped.measurements:
        ran = effective.lookup(m.stage, m.instruction, m.freq_mhz)
        if m.energy_j / m.time_s > limit_w:
            changed += 1
            assert ran.energy_j / ran.time_s <= limit_w  # a lower clock's cost, within the limit
        else:
            assert (ran.time_s, ran.energy_j) == (m.time_s, m.energy_j)
    assert changed > 0  # the shipped H100 profile has rows over 700 W (backwards at the top clocks)
    a100 = bundled_profile("a100_sxm")
    assert board_effective_profile(a100, "a100_sxm").measurements == a100.measurements  # no capping


def test_the_summary_gives_the_measured_saving_as_a_share_of_each_reference() -> None:
    result = {"saving_pct": 14.0, "slowdown_pct": 0.2, "profiling": {"iterations": 60}}
    figures = summary(result, {"reference_shipped_pct": 17.5, "reference_board_pct": 15.6})
    assert figures["of_shipped_reference"] == pytest.approx(0.8)
    assert figures["of_board_reference"] == pytest.approx(0.897)
    assert figures["profiling_iterations"] == 60
    assert "of_board_reference" not in summary(result)
    assert summary({}, {"reference_board_pct": 15.6})["of_board_reference"] is None


def family_profile(name: str) -> Profile:
    return read_profile_stream(io.StringIO(family_csv(f"family:{name}"), newline=""), source=name)


def test_the_references_profile_holds_every_board_clock_that_can_pay() -> None:
    board = load_board("h100_sxm")
    shipped = family_profile("dense-uneven-rc8x8")
    true = board_true_profile(shipped, "h100_sxm")
    effective = board_effective_profile(shipped, "h100_sxm")
    assert min(m.freq_mhz for m in true.measurements) < min(m.freq_mhz for m in shipped.measurements)
    least_w = board.idle_power_w(board.min_clock_mhz)
    shipped_rows = {(m.stage, m.instruction, m.freq_mhz) for m in shipped.measurements}
    for stage, instruction in {(m.stage, m.instruction) for m in shipped.measurements}:
        rows = sorted(
            (m for m in true.measurements if (m.stage, m.instruction) == (stage, instruction)), key=_time
        )
        assert board.max_clock_mhz in {r.freq_mhz for r in rows}  # all-max's clock, kept aside
        costs = [r.energy_j - least_w * r.time_s for r in rows if r.freq_mhz != board.max_clock_mhz]
        assert all(a > b for a, b in itertools.pairwise(costs))  # each slower option costs less
        for r in rows:  # where the shipped profile has the clock, the board's cost as before
            if (stage, instruction, r.freq_mhz) in shipped_rows:
                ran = effective.lookup(stage, instruction, r.freq_mhz)
                assert (r.time_s, r.energy_j) == pytest.approx((ran.time_s, ran.energy_j))


def _time(m: Measurement) -> float:
    return m.time_s

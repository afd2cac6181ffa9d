"""`benchmarks/workload_family.py`: the closed-loop suite's workloads, composed from per-kind curves, and the
suite's references and bars (`switch_reference.py`, `closed_loop_suite.py`)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from benchmarks.closed_loop_suite import family_bars, family_case, family_spec
from benchmarks.switch_reference import (
    board_switch_model,
    no_slowdown_point,
    reference_solve,
    switch_aware_pct,
)
from benchmarks.workload_family import (
    CLOCKS_MHZ,
    FAMILY,
    KINDS,
    bounds_violations,
    draw_workload,
    kind_curve,
    profile_csv,
    stage_cost,
    workload_named,
)
from perseusd.gpu.sim_boards import load_board
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, auto_unit_time_s, solve
from perseusd.planner.baselines import all_max
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.plan import Frontier, Plan
from perseusd.planner.profile_csv import profile_to_csv, read_profile_stream, read_profile_waiting
from perseusd.planner.switching import SwitchModel
from perseusd.workload.sim_costs import check_profile_fits


def test_the_family_covers_the_shapes_the_suite_needs() -> None:
    workloads = list(FAMILY.values())
    assert len(workloads) >= 24
    assert {w.stages for w in workloads} == {4, 6, 8}
    assert min(w.microbatches for w in workloads) == 8
    assert max(w.microbatches for w in workloads) == 32
    for flag in ("moe", "recompute", "balanced"):
        assert {bool(getattr(w, flag)) for w in workloads} == {True, False}, flag
    assert min(w.vocab for w in workloads) <= 32_000
    assert max(w.vocab for w in workloads) >= 256_000
    assert {w.block for w in workloads} >= {"block_h100", "block_h200"}
    assert {w.measured_gpu for w in workloads} == {"", "NVIDIA H200"}  # composed from the layer sweeps alone


@pytest.mark.parametrize("name", list(FAMILY))
def test_every_profile_is_within_physical_bounds_and_fits_the_board(name: str) -> None:
    workload = FAMILY[name]
    assert bounds_violations(workload) == []
    profile = read_profile_stream(io.StringIO(profile_csv(workload)), source=name)
    check_profile_fits(profile, load_board("h100_sxm"))
    assert profile.num_stages == workload.stages


def test_the_measured_block_is_the_shipped_profiles_middle_stages() -> None:
    shipped = bundled_profile("h100_sxm")
    for clock in (1980, 1440, 900):
        for instruction in ("forward", "backward"):
            time_s, power_w = kind_curve("block_h100", instruction)[clock]
            rows = [m for m in shipped.measurements if m.stage in (1, 2) and m.freq_mhz == clock]
            rows = [m for m in rows if m.instruction.value == instruction]
            assert 4 * time_s == pytest.approx(sum(m.time_s for m in rows) / 2)
            assert 4 * time_s * power_w == pytest.approx(sum(m.energy_j for m in rows) / 2)


def test_kinds_depend_on_the_clock_differently() -> None:
    def slowdown(kind: str) -> float:
        curve = kind_curve(kind, "forward")
        return curve[990][0] / curve[1980][0]

    assert slowdown("alltoall") == 1.0  # a wait the SM clock does not touch
    assert slowdown("memory") < 1.15  # HBM-bound: nearly flat
    assert slowdown("attention") > 1.8  # compute-bound, not capped
    block = kind_curve("block_h100", "forward")
    assert block[1665][0] / block[1980][0] < 1.02  # power-capped: flat over the top clocks
    assert set(KINDS) >= {"block_h100", "block_h200", "lm_head", "attention", "memory", "alltoall"}
    for kind in KINDS:
        assert set(kind_curve(kind, "backward")) == set(CLOCKS_MHZ)


def test_recomputation_adds_the_forward_to_the_backward_and_vocabulary_scales_the_head() -> None:
    dense = FAMILY["dense4x8"]
    recomputed = type(dense)("r", dense.layers, dense.microbatches, recompute=True, vocab=dense.vocab)
    for stage in range(dense.stages):
        plain = stage_cost(dense, stage, "backward", 1440)[0]
        layers_forward = stage_cost(dense, 1, "forward", 1440)[0]  # a middle stage: its layers alone
        extra = stage_cost(recomputed, stage, "backward", 1440)[0] - plain
        assert extra == pytest.approx(layers_forward)  # the layers' forward again, not the head's
    big = type(dense)("v", dense.layers, dense.microbatches, vocab=4 * dense.vocab)
    assert stage_cost(big, 3, "forward", 1980)[0] > 2 * stage_cost(dense, 3, "forward", 1980)[0]
    assert stage_cost(big, 1, "forward", 1980) == stage_cost(dense, 1, "forward", 1980)


@pytest.mark.parametrize("seed", range(0, 400, 8))
def test_drawn_workloads_are_within_physical_bounds_and_fit_the_board(seed: int) -> None:
    drawn = draw_workload(seed)
    assert bounds_violations(drawn) == []
    profile = read_profile_stream(io.StringIO(profile_csv(drawn)), source=drawn.name)
    check_profile_fits(profile, load_board("h100_sxm"))
    assert profile.num_stages == drawn.stages


def test_drawn_workloads_repeat_by_seed_and_span_the_familys_ranges() -> None:
    drawn = [draw_workload(seed) for seed in range(200)]
    assert [draw_workload(seed) for seed in range(200)] == drawn
    assert len({(w.layers, w.microbatches, w.vocab) for w in drawn}) == 200
    assert {w.stages for w in drawn} == set(range(4, 9))
    assert {w.microbatches for w in drawn} == set(range(8, 33))
    assert min(w.vocab for w in drawn) >= 32_000
    assert max(w.vocab for w in drawn) <= 256_000
    for flag in ("moe", "recompute", "balanced"):
        assert {bool(getattr(w, flag)) for w in drawn} == {True, False}, flag
    assert {w.block for w in drawn} == {"block_h100", "block_h200", "NVIDIA H200/matmul"}
    assert workload_named("drawn-17") == draw_workload(17)
    seventeen = draw_workload(17)
    assert family_spec("family:drawn-17") == (
        "h100_sxm",
        "family:drawn-17",
        seventeen.stages,
        seventeen.microbatches,
    )
    assert workload_named("dense4x8") is FAMILY["dense4x8"]
    with pytest.raises(KeyError, match="drawn-SEED"):
        workload_named("drawn-x")


def test_the_switch_aware_reference_follows_the_boards_lock_latency() -> None:
    model = board_switch_model("h100_sxm")
    assert model is not None
    assert 0.009 <= model.latency_s <= 0.015
    assert model.lead_s > model.latency_s
    profile = bundled_profile("h100_sxm")
    aware = switch_aware_pct(profile, 4, 8, "h100_sxm")
    assert aware is not None
    assert 10.0 < aware < 20.0


def test_the_suite_names_every_workload_and_judges_its_bars() -> None:
    cases = family_case()
    assert len(cases) == len(FAMILY)
    assert family_spec(cases[0])[0] == "h100_sxm"
    assert family_case(["dense4x8"]) == ["family:dense4x8"]
    with pytest.raises(SystemExit):
        family_spec("family:nonesuch")
    good = {
        "of_switch_aware_reference": 0.95,
        "slowdown_pct": 0.3,
        "profiling_iterations": 60,
        "wrong_clock_fraction": 0.05,
        "prediction_gap_pts": 0.5,
    }
    runs = [
        {"case": "family:a", "seed": 0, "summary": {**good, "measured_saving_pct": 15.0}},
        {"case": "family:a", "seed": 1, "summary": {**good, "measured_saving_pct": 15.5}},
        {"case": "family:b", "seed": 0, "summary": {**good, "measured_saving_pct": 12.0}},
        {"case": "family:b", "seed": 1, "summary": {**good, "measured_saving_pct": 9.5, "slowdown_pct": 1.4}},
    ]
    judged = family_bars(runs)
    assert judged["failed"] == ["family:b"]  # a slow run and 2.5 points between seeds
    assert judged["workloads"]["family:a"]["seed_spread_pts"] == 0.5
    assert judged["workloads"]["family:b"]["seed_spread_met"] is False
    assert judged["median_of_switch_aware_reference"] == 0.95
    assert judged["median_met"] is True


def test_on_lock_latency_long_computations_the_deployed_plan_keeps_the_late_cap_and_the_saving() -> None:
    """h200-layers4x16 (measured H200 kinds, 10-15 ms forwards: about one lock latency): the solver's
    least-energy plans within all-max's time begin more than 10 % of their computations before their clock;
    the no-slowdown point among the deployable ones (a descent from one, its short lowered runs merged,
    then whole runs moved) begins at most 10 % and keeps at least 95 % of their saving."""
    workload = FAMILY["h200-layers4x16"]
    profile = read_profile_stream(io.StringIO(profile_csv(workload)), workload.name)
    solved = reference_solve(profile, workload.stages, workload.microbatches, "h100_sxm")
    assert solved is not None
    frontier, base = solved
    computations = sum(len(row) for row in frontier.points[0].clocks_mhz)
    within = [p for p in frontier.points if p.predicted_time_s <= base.time_s * (1 + 1e-9)]
    over = [
        p for p in within if p.followed is not None and (p.followed.late_begins or 0) > 0.10 * computations
    ]
    assert over
    chosen = no_slowdown_point(frontier, base.time_s)
    assert chosen.followed is not None
    assert chosen.followed.late_begins is not None
    assert chosen.followed.late_begins <= 0.10 * computations
    assert chosen.followed.descended_from is not None
    assert chosen.predicted_time_s <= base.time_s * (1 + 1e-9)
    best_over_j = min(p.refined_energy_j for p in over)
    saving, over_saving = (1 - j / base.energy_j for j in (chosen.refined_energy_j, best_over_j))
    assert saving >= 0.95 * over_saving


def solve_online(
    path: Path, stages: int, microbatches: int, latency_s: float | None = None
) -> tuple[Frontier, Plan]:
    """The daemon's solve of a profile it measured online (with its waiting power by clock) on the
    `h100_sxm` board's switch model (with `latency_s`: that lock latency instead of the board's median),
    and all-max on it."""
    with path.open(encoding="utf-8") as stream:
        profile, waiting_w = read_profile_waiting(stream, str(path))
    p_block_w = waiting_w[-1][1]
    shape = JobShape("1f1b", stages, microbatches, 1)
    orders = shape.named_orders() or ()
    csv_text, unit_s = profile_to_csv(profile), auto_unit_time_s(profile)
    switch = board_switch_model("h100_sxm")
    if switch is not None and latency_s is not None:
        lead_s = latency_s + switch.lead_s - switch.latency_s
        switch = SwitchModel(latency_s, lead_s, min_run_s=switch.min_run_s / switch.lead_s * lead_s)
    task = SolveInput(path.stem, shape, orders, csv_text, path.stem, p_block_w, unit_s, switch, waiting_w)
    return solve(task).frontier, all_max(shape.dag(orders), profile, p_block_w)


ONLINE_PROFILE = Path(__file__).parent / "data" / "h200-layers4x16-online.csv"
"""The profile perseusd measured online for h200-layers4x16 on the simulated h100_sxm board (seed 0 of
`bench_closed_loop.py --suite family --trace-dir`): 6 clocks per stage, and its waiting power by clock."""


def test_an_online_profile_with_few_clocks_still_gets_a_deployable_plan_near_the_over_cap_one() -> None:
    """On the profile the daemon measured (its least-energy plan within all-max's time begins 60 of 128
    computations late), the repair merges runs into both neighbours where merging into one only moves the
    late begin; before that, no descent reached the cap within the budget and the job ran an all-max
    descent saving 8.5 %."""
    frontier, base = solve_online(ONLINE_PROFILE, 4, 16)
    free = no_slowdown_point(frontier, base.time_s, deployable_only=False)
    chosen = no_slowdown_point(frontier, base.time_s)
    assert free.followed is not None
    assert chosen.followed is not None
    assert (free.followed.late_begins or 0) > 0.10 * 128
    assert chosen.followed.late_begins is not None
    assert chosen.followed.late_begins <= 0.10 * 128
    saving, free_saving = (1 - p.refined_energy_j / base.energy_j for p in (chosen, free))
    assert saving >= 0.75 * free_saving


MOE_ONLINE_PROFILE = Path(__file__).parent / "data" / "moe-uneven6x12-online.csv"
"""The profile perseusd measured online for moe-uneven6x12 on the simulated h100_sxm board (seed 0 of
`bench_closed_loop.py --suite family --trace-dir`), with clocks filled between measured ones: its solver's
fastest point ends 0.003 % after all-max."""


def test_when_no_point_is_within_all_max_time_the_descent_starts_from_the_fastest_brought_within() -> None:
    """No frontier point was within all-max's time, so the descent started from all-max alone and the job
    ran a plan that lowered one stage: 3.35 % planned, 3.43 % measured, where the solver's fastest point
    saves 14 % (switches instant)."""
    assert deployed_saving(MOE_ONLINE_PROFILE, 6, 12) > 0.12


def deployed_saving(path: Path, stages: int, microbatches: int) -> float:
    """The saving of the point the daemon deploys with no slowdown on a profile it measured online, checked
    to be within all-max's time and the cap on late begins."""
    frontier, base = solve_online(path, stages, microbatches)
    chosen = no_slowdown_point(frontier, base.time_s)
    assert chosen.followed is not None
    assert chosen.followed.late_begins is not None
    assert chosen.followed.late_begins <= 0.10 * stages * microbatches * 2
    assert chosen.predicted_time_s <= base.time_s * (1 + 1e-9)
    return 1 - chosen.refined_energy_j / base.energy_j


SLOWER_START_PROFILE = Path(__file__).parent / "data" / "h200-layers4x16-online-seed1.csv"
"""The profile perseusd measured online for h200-layers4x16 on the simulated h100_sxm board (seed 1 of
`bench_closed_loop.py --suite family --trace-dir`, clocks filled and kept against the waiting power)."""


def test_a_slower_limits_plan_raised_into_all_max_time_when_no_repair_from_the_points_within_fits() -> None:
    """The points within all-max's time begin 60 of 128 computations before their clock, and no repair from
    them fit the budget: the descent from all-max saved 7.94 % (the closed loop measured 8.19 %) where the
    descent at 5 % over all-max saved 26.96 %. Raised into all-max's time (every computation by the same
    MHz) and descended, that plan saves 24.5 % within the cap."""
    assert deployed_saving(SLOWER_START_PROFILE, 4, 16) > 0.20


RC6X24_ONLINE_PROFILE = Path(__file__).parent / "data" / "dense-uneven-rc6x24-online.csv"
"""The profile perseusd measured online for dense-uneven-rc6x24 on the simulated h100_sxm board (seed 0 of
`bench_closed_loop.py --suite family --trace-dir`): 288 computations, 48 a stage."""


def test_a_millisecond_more_lock_latency_keeps_the_plans_saving() -> None:
    """A daemon reads the lock latency from a few calls a GPU, 12-13 ms on this board. The descent's segment
    moves judged only the lowest clocks of the first stage within the budget at 48 computations a stage, so
    what it found hung on its start: 20.9 % planned at 12 ms, 16.5 % at 13 ms. The coarse moves (runs and
    segments on a grid, at nearby clocks) reach nearly the same plan from either: 21.9 and 20.6 %."""
    savings = [
        1 - p.refined_energy_j / base.energy_j
        for frontier, base in (solve_online(RC6X24_ONLINE_PROFILE, 6, 24, s) for s in (0.012, 0.013))
        for p in (no_slowdown_point(frontier, base.time_s),)
    ]
    assert min(savings) >= 0.195
    assert abs(savings[0] - savings[1]) <= 0.015


DENSE8X8_ONLINE_PROFILE = Path(__file__).parent / "data" / "dense8x8-online-seed2.csv"
"""The profile perseusd measured online for dense8x8 on the simulated h100_sxm board (seed 2 of
`bench_closed_loop.py --suite family --trace-dir`)."""


def test_where_the_late_cap_binds_the_late_begins_go_where_they_save_most() -> None:
    """The descent spent the 12 late begins the cap allows on its first moves and left a middle stage at its
    highest clock throughout: 17.2 % on the board's costs where the job's other profiles planned 18.9 %, and
    the closed loop measured 16.3 % against 18.9-19.4 % for the other seeds. Reallocated (the plan descended
    with each late begin priced, then within the cap; and each stage that holds late begins set back to its
    highest clocks and the plan descended again), every stage but the last, which has no slack, runs
    lowered clocks (here, on the board's median lock latency, the third stage was the one left at its
    highest clock before)."""
    frontier, base = solve_online(DENSE8X8_ONLINE_PROFILE, 8, 8)
    chosen = no_slowdown_point(frontier, base.time_s)
    assert chosen.followed is not None
    assert chosen.followed.late_begins is not None
    assert chosen.followed.late_begins <= 0.10 * 128
    assert chosen.predicted_time_s <= base.time_s * (1 + 1e-9)
    lowered = [min(row) < 1980 for row in chosen.clocks_mhz]
    assert lowered[:-1] == [True] * 7
    assert 1 - chosen.refined_energy_j / base.energy_j > 0.18  # planned: 16.7 % before, 18.7 % now

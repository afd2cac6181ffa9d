"""The node cap's allocation: grants met, lower tiers first, least slowdown, never an impossible limit."""

from __future__ import annotations

import pytest

from perseusd.power.allocate import PLAN_HEADROOM, allocate, demand_w, floor_w, priority_demand_w
from perseusd.power.cap_inputs import CapPoint, GpuRange, JobLoad

GPUS = tuple(GpuRange(f"G{i}", 200.0, 700.0) for i in range(4))


def _job(name: str, gpus: tuple[str, ...], frontier: list[tuple[float, float]], priority: int = 1) -> JobLoad:
    """A job whose GPUs share each point's power evenly; (time_s, total_w) per point, fastest first."""
    points = tuple(
        CapPoint(
            i,
            time_s,
            {g: total_w / len(gpus) for g in gpus},
            {g: 1.2 * total_w / len(gpus) for g in gpus},
        )
        for i, (time_s, total_w) in enumerate(frontier)
    )
    return JobLoad(name, priority, points, 0)


FRONTIER = [(1.00, 1000.0), (1.02, 900.0), (1.05, 820.0), (1.15, 760.0), (1.40, 700.0)]


def test_uncapped_when_demand_fits() -> None:
    job = _job("a", ("G0", "G1"), FRONTIER)
    alloc = allocate(GPUS, [job], 3000.0)
    assert alloc.feasible
    assert not alloc.strict
    assert alloc.jobs[0].index == 0
    assert alloc.jobs[0].slowdown == 0.0
    assert alloc.planned_w <= 3000.0


def test_unmanaged_gpus_are_held_first_then_jobs_least_slowdown() -> None:
    job = _job("a", ("G0", "G1"), FRONTIER)
    # 2 unmanaged GPUs at 700 each + job 1000 = 2400. A grant of 1800: the unmanaged GPUs give 600
    # (to 400 each), the job (normal tier) nothing.
    alloc = allocate(GPUS, [job], 1800.0, headroom=0.0)
    assert alloc.limits_w["G2"] == pytest.approx(400.0)
    assert alloc.limits_w["G3"] == pytest.approx(400.0)
    assert alloc.jobs[0].slowdown == 0.0
    # A grant of 1300: the unmanaged GPUs give all they can (to 200 each), the job 100 W more: 1.02.
    alloc = allocate(GPUS, [job], 1300.0, headroom=0.0)
    assert alloc.feasible
    assert alloc.limits_w["G2"] == pytest.approx(200.0)
    assert alloc.limits_w["G3"] == pytest.approx(200.0)
    assert alloc.jobs[0].index == 1
    assert alloc.jobs[0].slowdown == pytest.approx(0.02)
    assert alloc.planned_w <= 1300.0 + 1e-6


def test_the_plan_aims_below_the_grant_by_the_headroom() -> None:
    job = _job("a", ("G0", "G1"), FRONTIER)
    alloc = allocate(GPUS, [job], 1300.0)
    assert alloc.planned_w <= 1300.0 * (1 - PLAN_HEADROOM) + 1e-6
    assert alloc.jobs[0].index == 2  # 900 W would leave no headroom (with the unmanaged GPUs' 400 W)


def test_lower_tier_slowed_first() -> None:
    low = _job("low", ("G0", "G1"), FRONTIER, priority=0)
    high = _job("high", ("G2", "G3"), FRONTIER, priority=2)
    alloc = allocate(GPUS, [low, high], 1800.0)  # 2000 -> 1800: low alone can give 240
    grants = {g.name: g for g in alloc.jobs}
    assert grants["high"].slowdown == 0.0
    assert grants["low"].slowdown > 0.0
    assert alloc.planned_w <= 1800.0 + 1e-6
    # once the low tier is at its slowest, the high tier gives the rest
    alloc = allocate(GPUS, [low, high], 1500.0)
    grants = {g.name: g for g in alloc.jobs}
    assert grants["low"].index == len(FRONTIER) - 1
    assert grants["high"].slowdown > 0.0
    assert alloc.planned_w <= 1500.0 + 1e-6


def test_within_a_tier_the_cheaper_job_gives_first() -> None:
    steep = _job("steep", ("G0", "G1"), [(1.0, 1000.0), (1.5, 900.0)])
    flat = _job("flat", ("G2", "G3"), [(1.0, 1000.0), (1.01, 900.0)])
    alloc = allocate(GPUS, [steep, flat], 1900.0, headroom=0.0)
    grants = {g.name: g for g in alloc.jobs}
    assert grants["flat"].index == 1
    assert grants["steep"].index == 0


def test_hand_back_spends_what_a_big_step_saved_beyond_the_need() -> None:
    # Both moves cost 0.001 relative time per watt; the bigger one is taken, then what it saved beyond the
    # need is handed back: the job ends at the fastest point that fits.
    job = _job("a", ("G0", "G1"), [(1.0, 1000.0), (1.01, 990.0), (1.5, 500.0)], priority=0)
    alloc = allocate(GPUS[:2], [job], 995.0, headroom=0.0)
    assert alloc.jobs[0].index == 1
    assert alloc.planned_w <= 995.0 + 1e-6


def test_plan_that_cannot_fit_falls_back_to_strict_limits_within_the_grant() -> None:
    job = _job("a", tuple(g.uuid for g in GPUS), [(1.0, 1000.0), (1.3, 900.0)])
    alloc = allocate(GPUS, [job], 850.0)  # above the floor (800 W), below the slowest point
    assert alloc.feasible
    assert alloc.strict
    assert "slowest points" in alloc.reason
    assert alloc.jobs[0].index == 1
    assert sum(alloc.limits_w.values()) <= 850.0 + 1e-6
    assert all(w >= 200.0 for w in alloc.limits_w.values())


def test_strict_enforcement_limits_sum_within_grant() -> None:
    job = _job("a", ("G0", "G1"), FRONTIER)
    alloc = allocate(GPUS, [job], 1800.0, enforcement="strict")
    assert alloc.strict
    assert sum(alloc.limits_w.values()) <= 1800.0 + 1e-6


def test_infeasible_cap_is_reported_and_never_an_impossible_limit() -> None:
    alloc = allocate(GPUS, [], 500.0)
    assert not alloc.feasible
    assert "floor 800 W" in alloc.reason
    assert alloc.limits_w == {g.uuid: 200.0 for g in GPUS}


def test_window_limits_follow_each_gpu_plan_peak() -> None:
    job = _job("a", ("G0", "G1"), FRONTIER)
    alloc = allocate(GPUS, [job], 2400.0)
    assert alloc.limits_w["G0"] == pytest.approx(min(700.0, 1.2 * 500.0 * 1.03))


def test_floor_demand_and_tiers() -> None:
    job = _job("a", ("G0", "G1"), FRONTIER, priority=2)
    assert floor_w(GPUS) == 800.0
    assert demand_w(GPUS, [job]) == pytest.approx(1000.0 + 1400.0)
    tiers = priority_demand_w(GPUS, [job])
    assert tiers[0] == pytest.approx(1000.0)  # the unmanaged GPUs' 2 x (700 - 200)
    assert tiers[2] == pytest.approx(1000.0 - 400.0)
    assert tiers[1] == 0.0


def test_bad_enforcement_is_refused() -> None:
    with pytest.raises(ValueError, match="enforcement"):
        allocate(GPUS, [], 1000.0, enforcement="loose")

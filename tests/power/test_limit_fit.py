"""Power limits below the plans' peaks: the capping model on a job's DAG, the fit used when no frontier point
fits a grant, and the hard line (limits summing to the grant) searched on the DAG."""

from __future__ import annotations

import pytest

from perseusd.planner.dag import build_dag
from perseusd.power.allocate import allocate
from perseusd.power.cap_inputs import CapPoint, GpuRange, JobLoad
from perseusd.power.hard_line import best_hard_line, search_limits
from perseusd.power.limit_model import LimitModel, LocalPipeline

DAG = build_dag("1f1b", 2, 4, 1)
GPUS = (GpuRange("G0", 100.0, 400.0), GpuRange("G1", 100.0, 400.0))
P_BLOCK_W = 50.0
# Each computation at 3 clocks, fastest first: (time s, power W); stage 1 draws less than stage 0.
OPTIONS = {0: [(0.10, 390.0), (0.12, 300.0), (0.20, 200.0)], 1: [(0.10, 330.0), (0.12, 250.0), (0.20, 180.0)]}


def _model() -> LimitModel:
    options = [OPTIONS[c.stage] for c in DAG.computations]
    return LimitModel(DAG, options, [LocalPipeline(("G0", "G1"))], P_BLOCK_W, window_s=1.0)


def _job() -> JobLoad:
    """One point only (the frontier ends there), drawing more than the grants below."""
    model = _model()
    time_s, window_w = model.evaluate({})
    point = CapPoint(0, time_s, {"G0": 300.0, "G1": 260.0}, {"G0": 390.0, "G1": 330.0}, window_w)
    return JobLoad("a", 1, (point,), 0, limit_model=lambda _index: model)


def test_limits_cap_each_computation_to_the_highest_clock_that_fits() -> None:
    model = _model()
    free_s, free_w = model.evaluate({})
    capped_s, capped_w = model.evaluate({"G0": 300.0, "G1": 400.0})
    assert capped_s > free_s  # stage 0 runs its 300 W clock
    assert capped_w < free_w
    floor_s, _ = model.evaluate({"G0": 150.0, "G1": 150.0})  # nothing fits: the lowest clock
    assert floor_s == pytest.approx(model.evaluate({"G0": 200.0, "G1": 180.0})[0])


def test_no_point_fits_limits_below_the_peaks_hold_the_modelled_window() -> None:
    job = _job()
    target_w = job.points[0].window_w * 0.85
    alloc = allocate(GPUS, [job], target_w / 0.99)
    assert alloc.feasible
    assert not alloc.strict
    assert "power limits of at most" in alloc.reason
    assert alloc.planned_w <= target_w + 1e-6
    assert alloc.limits_w["G0"] < 390.0
    assert alloc.jobs[0].slowdown > 0  # the modelled time under the limits, not the point's
    # what the limits were fitted on is what the model says they give
    assert _model().evaluate(alloc.limits_w)[1] == pytest.approx(alloc.planned_w)


def test_without_a_model_the_limits_are_strict() -> None:
    job = _job()
    bare = JobLoad(job.name, job.priority, job.points, job.base_index)
    grant_w = job.points[0].window_w * 0.85 / 0.99
    alloc = allocate(GPUS, [bare], grant_w)
    assert alloc.strict
    assert sum(alloc.limits_w.values()) <= grant_w + 1e-6


def test_hard_line_limits_sum_within_the_grant_and_spend_it_where_time_is_saved() -> None:
    model = _model()

    def time_under(limits_w: dict[str, float]) -> float:
        return model.evaluate(limits_w)[0]

    limits = search_limits(GPUS, {"G0": 400.0, "G1": 400.0}, 640.0, time_under, step_w=10.0)
    assert limits is not None
    assert sum(limits.values()) <= 640.0 + 1e-9
    assert all(100.0 <= w <= 400.0 for w in limits.values())
    # one level for both (320 W) slows both stages; the search keeps one of them at its top clock
    assert time_under(limits) < time_under({"G0": 320.0, "G1": 320.0})
    assert search_limits(GPUS, {}, 150.0, time_under, 10.0) is None  # below the minimum limits
    best = best_hard_line(GPUS, [(0, {"G0": 400.0, "G1": 400.0}, time_under)], 640.0)
    assert best is not None
    assert best.sum_w <= 640.0 + 1e-9

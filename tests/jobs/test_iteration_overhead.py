"""A `time` target is in measured seconds: the time an iteration spends outside the computations the plan
knows (measured at all-max clocks while profiling) is left for when choosing the point."""

from __future__ import annotations

import pytest

from perseusd.jobs.job import Job
from perseusd.jobs.shape import JobShape
from perseusd.jobs.slot import StageSlot
from perseusd.planner.policy import PointSummary, Policy
from tests.support.jobs import job_of_slots

SHAPE = JobShape("1f1b", 2, 4, 1)
POINTS = [
    PointSummary(0, 0.220, 90.0),
    PointSummary(1, 0.190, 100.0),
    PointSummary(2, 0.170, 110.0),
    PointSummary(3, 0.164, 112.0),  # all-max
]


def _job(policy: Policy) -> Job:
    job = job_of_slots(SHAPE, "H200", policy, (1980, 1500))
    job.points, job.all_max = POINTS, POINTS[3]
    return job


def _iterate(slot: StageSlot, times_s: list[float]) -> None:
    t_ns = 1_000_000_000
    slot.step_begin(t_ns)
    for time_s in times_s:
        t_ns += round(time_s * 1e9)
        slot.step_begin(t_ns)


def test_the_overhead_is_the_median_measured_all_max_iteration_less_the_predicted_one() -> None:
    job = _job(Policy("time", 0.175))
    assert job.iteration_overhead_s() is None  # not measured: the target is compared as it is
    assert job.choose_point().point.index == 2  # type: ignore[union-attr]
    for slot in job.slots.values():
        _iterate(slot, [0.5, 0.168, 0.1685, 0.57, 0.1675])  # one stall; the 0.5 s before the segment
        slot.all_max_iteration_s = slot.median_recent_iteration_s(4)
    assert job.iteration_overhead_s() == pytest.approx((0.168 + 0.1685) / 2 - 0.164)
    # 0.175 s measured leaves 0.17075 s of predicted time: point 2 (0.170 s) still fits; 0.173 s does not.
    assert job.choose_point().point.index == 2  # type: ignore[union-attr]
    job.policy = Policy("time", 0.173)
    assert job.choose_point().point.index == 3  # type: ignore[union-attr]


def test_a_job_faster_than_predicted_has_no_negative_overhead() -> None:
    job = _job(Policy("time", 0.19))
    for slot in job.slots.values():
        _iterate(slot, [0.160, 0.161, 0.160])
        slot.all_max_iteration_s = slot.median_recent_iteration_s(3)
    assert job.iteration_overhead_s() == 0.0
    assert job.choose_point().point.index == 1  # type: ignore[union-attr]

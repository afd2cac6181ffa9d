"""The cap on top of the straggler response and the policy; which frontier points the cap models."""

from __future__ import annotations

import itertools

from perseusd.jobs.job import Job
from perseusd.jobs.response import capped
from perseusd.jobs.shape import JobShape
from perseusd.planner.policy import PointSummary, Policy
from perseusd.power.cap_inputs import candidate_indices

POINTS = [PointSummary(i, 1.0 + 0.01 * i, 100.0 - i) for i in range(10)]


def _job() -> Job:
    job = Job("j", 0, JobShape("1f1b", 1, 2, 1), "gpu", "sig", Policy())
    job.points = list(POINTS)
    job.points_by_index = {p.index: p for p in POINTS}
    return job


def test_the_cap_only_ever_slows_a_pipeline() -> None:
    job = _job()
    assert capped(job, POINTS[2]) is POINTS[2]  # uncapped
    job.cap_index = 5
    assert capped(job, POINTS[2]) is POINTS[5]  # the policy's point is faster: the cap wins
    assert capped(job, POINTS[7]) is POINTS[7]  # straggler slack already slower: it stays


def test_candidates_spread_in_time_with_both_ends() -> None:
    many = [PointSummary(i, 1.0 + i / 1000, 1000.0 - i) for i in range(2000)]
    chosen = candidate_indices(many, 64)
    assert len(chosen) <= 64
    assert 0 in chosen
    assert 1999 in chosen
    times = sorted(many[i].time_s for i in chosen)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 3 * (times[-1] - times[0]) / 63
    assert candidate_indices(POINTS, 64) == [p.index for p in POINTS]

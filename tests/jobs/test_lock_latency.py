"""The clock-set latency a job's plans are solved for (`perseusd.jobs.lock_latency`)."""

from __future__ import annotations

import random
import statistics

from perseusd.jobs.lock_latency import job_latency_s


def _calls_s(rng: random.Random, calls: int, slower_s: float = 0.0) -> list[float]:
    """Clock-set calls as the simulated H100 takes them: 9-15 ms, uniform."""
    return [rng.uniform(0.009, 0.015) + slower_s for _ in range(calls)]


def test_no_call_measured_gives_no_latency() -> None:
    assert job_latency_s([]) is None
    assert job_latency_s([(), ()]) is None


def test_like_gpus_read_the_calls_median_not_the_slowest_gpus_median() -> None:
    """Four GPUs of 8 calls each, 400 jobs: the pooled reading centres on the calls' median (12 ms) and
    spreads less than the slowest GPU's median, which reads about a millisecond high."""
    rng = random.Random(7)
    pooled, slowest = [], []
    for _ in range(400):
        gpus = [_calls_s(rng, 8) for _ in range(4)]
        latency_s = job_latency_s(gpus)
        assert latency_s is not None
        pooled.append(latency_s)
        slowest.append(max(statistics.median(calls) for calls in gpus))
    assert abs(statistics.mean(pooled) - 0.012) < 0.0004
    assert statistics.mean(slowest) - 0.012 > 0.0007
    assert statistics.stdev(pooled) < statistics.stdev(slowest)


def test_a_gpu_clearly_slower_than_the_others_sets_the_jobs_latency() -> None:
    """One GPU 10 ms slower than three others: the job is solved for about that GPU's calls, not for the
    pooled median the three fast GPUs hold down."""
    rng = random.Random(3)
    gpus = [_calls_s(rng, 8, slower_s=0.010), *(_calls_s(rng, 8) for _ in range(3))]
    latency_s = job_latency_s(gpus)
    assert latency_s is not None
    pooled_s = statistics.median(s for calls in gpus for s in calls)
    assert latency_s > pooled_s + 0.005
    assert latency_s <= max(gpus[0])

"""Measured energy per iteration from a coarse energy counter."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from perseusd.jobs.metering import counter_power_w, iteration_energy_j, job_measurement
from perseusd.jobs.shape import JobShape
from perseusd.planner.policy import Policy
from perseusd.profiling.trace import CounterSample, CounterTrace
from perseusd.switching.energy_sampler import EnergySampler
from tests.support.jobs import job_of_slots

PERIOD_NS = 100_000_000  # an H100's counter moves every 100 ms


def _trace(power_w: float, seconds: float, first_read_ns: int = 37_000_000) -> list[CounterSample]:
    """What the sampler keeps of a counter updated every 100 ms at `power_w`, read every 10 ms."""
    trace = CounterTrace()
    for read_ns in range(first_read_ns, int(seconds * 1e9), 10_000_000):
        updated_ns = read_ns // PERIOD_NS * PERIOD_NS  # the value holds the energy up to the last update
        trace.add(read_ns, int(power_w * updated_ns / 1e6))
    return trace.samples(0)


def test_power_comes_from_counter_updates_not_reads() -> None:
    samples = _trace(300.0, 3.0)
    assert counter_power_w(samples) == pytest.approx(300.0, rel=0.01)
    # Naively over the first and last reads: the first read's value is up to an update old.
    naive_w = (
        (samples[-1].energy_mj - samples[0].energy_mj) / 1000 / ((samples[-1].t_ns - samples[0].t_ns) / 1e9)
    )
    assert abs(naive_w / 300.0 - 1) > abs(counter_power_w(samples) / 300.0 - 1)  # type: ignore[operator]


def test_too_short_a_span_is_not_a_measurement() -> None:
    assert counter_power_w(_trace(300.0, 0.35)) is None
    assert counter_power_w(_trace(300.0, 4.0), min_span_s=5.0) is None
    assert counter_power_w([]) is None


def test_iteration_energy_is_power_times_iteration_time() -> None:
    assert iteration_energy_j(_trace(250.0, 8.0), 0.5) == pytest.approx(125.0, rel=0.01)
    assert iteration_energy_j(_trace(250.0, 8.0), None) is None


def test_an_iteration_is_timed_over_the_counters_span_only() -> None:
    """The running plan's energy per iteration is its counter power times the iterations timed since the
    plan began: profiling's slower iterations before it do not count (a demo once reported 10 % measured
    against 15 % saved, after 10 iterations of the plan)."""
    job = job_of_slots(JobShape("1f1b", 2, 4, 1), "H100", Policy("no_slowdown"), (1980, 1500))
    slot = next(iter(job.slots.values()))
    t_ns = 1_000_000_000
    for seconds in (0.9, 0.9, 0.9, 0.7, 0.7):  # three profiling iterations, then the plan's
        slot.step_begin(t_ns)
        t_ns += round(seconds * 1e9)
    slot.step_begin(t_ns)
    plan_since_ns = t_ns - round(1.4e9)
    assert slot.mean_iteration_time_s(plan_since_ns) == pytest.approx(0.7)
    assert slot.mean_iteration_time_s() == pytest.approx(0.82)
    assert slot.mean_iteration_time_s(t_ns) is None  # none timed yet in the span
    assert iteration_energy_j(_trace(250.0, 8.0), slot.mean_iteration_time_s(plan_since_ns)) == pytest.approx(
        175.0, rel=0.01
    )


def test_job_measurement_needs_every_gpu() -> None:
    measured = job_measurement([(100.0, 120.0), (90.0, 110.0)], iterations=10)
    assert measured is not None
    assert (measured.running_j, measured.all_max_j) == (190.0, 230.0)
    assert measured.saved_j == pytest.approx(400.0)
    partial = job_measurement([(100.0, 120.0), (90.0, None)], iterations=10)
    assert partial is not None
    assert partial.all_max_j is None
    assert partial.saved_j is None  # never a saving from half the GPUs
    assert job_measurement([(100.0, 120.0), (None, 110.0)], iterations=10) is None
    assert job_measurement([], iterations=0) is None


def _counting_reader(reads: list[str]) -> Callable[[str], Future[tuple[int, int]]]:
    """An energy read that records the GPU it was asked for and answers (n, n) for the n-th read."""

    def read(gpu: str) -> Future[tuple[int, int]]:
        reads.append(gpu)
        done: Future[tuple[int, int]] = Future()
        done.set_result((len(reads), len(reads)))
        return done

    return read


def test_a_slow_watch_reads_every_nth_round() -> None:
    reads: list[str] = []
    read = _counting_reader(reads)

    sampler = EnergySampler(read, period_s=0.01)
    sampler.watch("fast")
    sampler.watch("slow", period_s=0.05)
    for _ in range(10):
        sampler.sample_once()
    assert (reads.count("fast"), reads.count("slow")) == (10, 2)


def test_the_sampler_sleeps_until_a_watched_gpu_is_due() -> None:
    sampler = EnergySampler(_counting_reader([]), period_s=0.01)
    sampler.watch("running", period_s=1.0)  # a running job's GPU: once a second, 100 rounds
    sampler.sample_once()
    assert sampler.rounds_until_due() == 99
    sampler.watch("profiling")  # every round
    assert sampler.rounds_until_due() == 1


def test_the_sampler_thread_reads_a_slow_watch_about_once_per_its_period() -> None:
    """At most a few reads (and wake-ups) in half a second for a GPU read once a second; no timing asserted
    beyond the order of magnitude (a loaded machine only makes it fewer)."""
    reads: list[str] = []
    read = _counting_reader(reads)

    sampler = EnergySampler(read, period_s=0.005)
    sampler.watch("running", period_s=0.25)
    sampler.start()
    try:
        time.sleep(0.6)
    finally:
        sampler.stop()
    assert 1 <= len(reads) <= 4

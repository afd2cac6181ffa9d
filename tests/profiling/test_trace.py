"""The counter trace keeps only informative samples and interpolates energy between them."""

from __future__ import annotations

import pytest

from perseusd.profiling.trace import CounterSample, CounterTrace


def test_keeps_the_first_sample_and_then_only_changes() -> None:
    trace = CounterTrace()
    reads = [(0, 100), (10, 100), (20, 100), (30, 250), (40, 250), (50, 400), (60, 400)]
    kept = [trace.add(t_ns, energy_mj) for t_ns, energy_mj in reads]
    assert kept == [True, False, False, True, False, True, False]
    assert trace.samples() == [CounterSample(0, 100), CounterSample(30, 250), CounterSample(50, 400)]
    assert len(trace) == 3
    assert trace.samples(since_ns=30) == [CounterSample(30, 250), CounterSample(50, 400)]
    assert trace.samples(since_ns=31) == [CounterSample(50, 400)]


def test_ignores_reads_that_go_back_in_time() -> None:
    trace = CounterTrace()
    assert trace.add(100, 5)
    assert not trace.add(99, 7)
    assert trace.add(100, 7)
    assert [s.energy_mj for s in trace.samples()] == [5, 7]


def test_energy_interpolates_linearly_between_kept_samples() -> None:
    trace = CounterTrace()
    for t_ns, energy_mj in [(0, 0), (50, 0), (100, 1000), (150, 1000), (200, 3000)]:
        trace.add(t_ns, energy_mj)
    assert trace.energy_j(0, 100) == pytest.approx(1.0)
    assert trace.energy_j(50, 150) == pytest.approx(0.5 + 1.0)
    assert trace.energy_j(100, 200) == pytest.approx(2.0)
    assert trace.energy_j(120, 120) == 0.0


def test_energy_outside_the_samples_is_unknown() -> None:
    trace = CounterTrace()
    assert trace.energy_j(0, 10) is None
    trace.add(100, 0)
    trace.add(200, 1000)
    assert trace.energy_j(50, 150) is None
    assert trace.energy_j(150, 250) is None
    assert trace.energy_j(180, 120) is None
    assert trace.energy_j(100, 200) == pytest.approx(1.0)


def test_memory_is_bounded_by_dropping_the_oldest_samples() -> None:
    trace = CounterTrace(max_samples=10)
    for index in range(25):
        trace.add(index, index)
    assert 9 <= len(trace) <= 10
    samples = trace.samples()
    assert samples[-1] == CounterSample(24, 24)
    assert [s.t_ns for s in samples] == list(range(25 - len(trace), 25))
    with pytest.raises(ValueError, match="max_samples"):
        CounterTrace(max_samples=1)

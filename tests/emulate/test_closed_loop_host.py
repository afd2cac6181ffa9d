"""`benchmarks/bench_closed_loop.py` says when its runs overload the machine, and records the load of each."""

from __future__ import annotations

from benchmarks.bench_closed_loop import host_load, overload_warning


def test_runs_that_leave_each_other_no_core_are_warned_of() -> None:
    assert overload_warning(1, 2) is None  # one run alone: the measurement the bars mean
    assert overload_warning(1, 1) is None
    assert overload_warning(2, 4) is None  # a core each and one to spare
    warning = overload_warning(2, 2)
    assert warning is not None
    assert "--parallel 2 on 2 cores" in warning
    assert overload_warning(4, 4) is not None
    assert overload_warning(3, None) is None  # cores unknown: nothing to say


def test_each_run_records_the_machine_it_was_measured_on() -> None:
    host = host_load(2, 0.5)
    assert host["parallel"] == 2
    assert host["cpus"] >= 1
    before, after = host["load_1min"]
    assert before == 0.5
    assert after >= 0.0

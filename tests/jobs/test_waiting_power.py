"""The waiting power by held clock a job's profiling measured (`Job.measured_waiting_w`), and the solve it
feeds: a plan's predicted energy counts its waits at the clocks held in them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perseusd.jobs.job import Job
from perseusd.jobs.observed import OrderLearner
from perseusd.jobs.shape import JobShape
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.solving import SolveInput, solve
from perseusd.planner.policy import Policy
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.switching import SwitchModel
from tests.support.synthetic import synthetic_profile

SHAPE = JobShape("1f1b", 3, 4, 1)


def _job(waiting_by_gpu: list[dict[int, float]]) -> Job:
    job = Job("train", 1000, SHAPE, "H100", "sig", Policy())
    for stage, waiting in enumerate(waiting_by_gpu):
        job.slots[f"GPU-{stage}"] = StageSlot(
            gpu=f"GPU-{stage}",
            pipeline=0,
            stage=stage,
            pid=1,
            num_stages=SHAPE.num_stages,
            learner=OrderLearner(SHAPE.num_microbatches, SHAPE.chunks),
            supported_clocks_mhz=(1980, 1440, 900),
            waiting_w_by_clock=waiting,
        )
    return job


def test_the_waiting_power_per_clock_is_the_median_of_the_gpus_and_never_falls_with_the_clock() -> None:
    job = _job(
        [
            {1980: 130.0, 1440: 100.0, 900: 80.0},
            {1980: 128.0, 1440: 98.0, 900: 110.0},  # a noisy low estimate
            {1980: 132.0, 1440: 102.0, 900: 78.0},
        ]
    )
    assert job.measured_waiting_w() == ((900, 80.0), (1440, 100.0), (1980, 130.0))
    assert job.measured_waiting_w({"GPU-0": 2.0, "GPU-1": 2.0, "GPU-2": 2.0})[0] == (900, 160.0)
    high = _job([{1980: 130.0, 900: 140.0}])  # the low clock above the high one: held at it, not below
    assert high.measured_waiting_w() == ((900, 140.0), (1980, 140.0))
    assert _job([{}, {}, {}]).measured_waiting_w() == ()


def test_a_solve_with_a_waiting_power_predicts_less_energy_where_plans_lower_clocks() -> None:
    """The same frontier, its points' energies with their waits at the clocks held (60 W at 885 MHz, the
    blocking power at 1410 and above): lower where a point lowers clocks, its time the same."""
    profile = synthetic_profile(3, seed=2)
    orders = SHAPE.named_orders() or ()
    switch = SwitchModel(0.005, 0.007)
    task = SolveInput("j", SHAPE, orders, profile_to_csv(profile), "p", 100.0, 0.001, switch)
    blocking = {p.clocks_mhz: p for p in solve(task).frontier.points}
    held = solve(replace(task, waiting_w=((885, 60.0), (1410, 100.0)))).frontier.points
    same = [(blocking[p.clocks_mhz], p) for p in held if p.clocks_mhz in blocking]
    lowered = [(old, new) for old, new in same if min(min(row) for row in new.clocks_mhz) < 1410]
    assert lowered
    for old, new in lowered:
        assert new.refined_energy_j < old.refined_energy_j
        assert new.predicted_time_s == pytest.approx(old.predicted_time_s)

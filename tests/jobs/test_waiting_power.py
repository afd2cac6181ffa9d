"""The waiting power by held clock a job's profiling measured (`Job.measured_waiting_w`), and the solve it
feeds: a plan's predicted energy counts its waits at the clocks held in them."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
from perseus_client import protocol as p

from perseusd.jobs.job import Job
from perseusd.jobs.profiling_run import least_waiting_w
from perseusd.jobs.settings import JobSettings
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, solve
from perseusd.planner.policy import Policy
from perseusd.planner.profile_csv import profile_to_csv, read_profile_waiting
from perseusd.planner.switching import SwitchModel
from perseusd.planner.waiting import monotone_fit
from tests.support.callers import ME
from tests.support.daemon_core import sim_core, tick_until
from tests.support.jobs import job_of_slots
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

SHAPE = JobShape("1f1b", 3, 4, 1)


def _job(waiting_by_gpu: list[dict[int, float]]) -> Job:
    return job_of_slots(SHAPE, "H100", Policy(), (1980, 1440, 900), waiting_by_gpu)


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
    high = _job([{1980: 130.0, 900: 140.0}])  # the low clock above the high one: pooled with it
    assert high.measured_waiting_w() == ((900, 135.0), (1980, 135.0))
    assert _job([{}, {}, {}]).measured_waiting_w() == ()


def test_the_options_are_kept_against_the_least_waiting_power_measured() -> None:
    """What a computation that runs longer into its wait saves per second at the least: the lowest fitted
    waiting power (0 W when the profiling measured none, and the options are kept by energy alone)."""
    job = _job([{1980: 130.0, 1440: 100.0, 900: 80.0}, {1980: 128.0, 900: 76.0}])
    assert least_waiting_w(job) == 78.0
    assert least_waiting_w(_job([{}, {}, {}])) == 0.0


def test_one_noisy_low_clock_does_not_hold_the_clocks_above_it_at_the_blocking_power() -> None:
    """What a 4-stage run measured (dense-uneven-rc4x16, seed 1): the GPUs' medians follow the board's idle
    power but 900 MHz's came out at 132 W. Lifting each clock to the highest below it held every clock from
    900 MHz up at 132 W (the plan's waits predicted at the blocking power: 12.3 % predicted, 17.1 %
    measured); the monotone fit pools 900 MHz with the clocks up to 1470 (101 W) and leaves the rest."""
    measured = {705: 71.4, 900: 132.1, 960: 81.2, 1215: 91.5, 1470: 99.6, 1725: 116.0, 1980: 128.7}
    job = _job([measured, measured, measured])
    fitted = dict(job.measured_waiting_w())
    assert fitted[705] == 71.4
    pooled = [fitted[clock] for clock in (900, 960, 1215, 1470)]
    assert pooled == pytest.approx([(132.1 + 81.2 + 91.5 + 99.6) / 4] * 4)
    assert (fitted[1725], fitted[1980]) == (116.0, 128.7)
    values = [watts for _, watts in job.measured_waiting_w()]
    assert values == sorted(values)


def test_the_monotone_fit_is_the_weighted_least_squares_one() -> None:
    assert monotone_fit([1.0, 2.0, 3.0], [1, 1, 1]) == [1.0, 2.0, 3.0]
    assert monotone_fit([3.0, 1.0], [1, 3]) == [1.5, 1.5]  # weighted by the GPUs behind each value
    assert monotone_fit([1.0, 5.0, 2.0, 2.0, 6.0], [1, 1, 1, 1, 1]) == [1.0, 3.0, 3.0, 3.0, 6.0]
    assert monotone_fit([], []) == []


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


def test_an_imported_waiting_power_is_planned_with_exported_and_cached(tmp_path: Path) -> None:
    """A profile file with a `waiting_power` column, imported before the job registers: the job plans with
    that waiting power, exports it again, and a second run of the job finds it in the cache; an import of a
    file without the column replaces it with none."""
    stages, microbatches = 2, 4
    profile = synthetic_profile(stages, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    waiting = ((1005, 61.25), (1410, 80.0))
    with sim_core(tmp_path, gpus=stages, jobs=JobSettings()) as core:
        assert core.jobs is not None

        def run_job() -> None:
            core.handle(ME, p.Hello(job="train", client_version="test"))
            core.handle(ME, p.Claim(gpus=core.registry.uuids, job="train"))
            for stage, gpu in enumerate(core.registry.uuids):
                message = p.Register(gpu, "train", 0, stage, stages, microbatches, "1f1b", 1)  # type: ignore[arg-type]
                assert isinstance(core.handle(ME, message), p.RegisterOk)

        imported = core.handle(ME, p.ProfileImport("train", profile_to_csv(profile, waiting), "w.csv", 80.0))
        assert isinstance(imported, p.ProfileImportOk)
        run_job()
        job = core.jobs.jobs["train"]
        assert job.waiting_w == waiting
        exported = core.handle(ME, p.ProfileExport("train"))
        assert isinstance(exported, p.ProfileReply)
        assert read_profile_waiting(io.StringIO(exported.csv), "export")[1] == waiting
        tick_until(core, lambda: job.frontier is not None)
        core.handle(ME, p.Release(gpus=()))
        run_job()  # the same job again: its profile and waiting power from the cache
        again = core.jobs.jobs["train"]
        assert again.cached
        assert again.waiting_w == waiting
        plain = core.handle(ME, p.ProfileImport("train", profile_to_csv(profile), "plain.csv", 80.0))
        assert isinstance(plain, p.ProfileImportOk)
        assert again.waiting_w == ()

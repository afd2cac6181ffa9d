"""A job's own error (`perseusd.jobs.accuracy`): its profile's estimated error, its predicted and measured
saving, and the re-plan when the measurement falls short of the prediction by more than that error."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from perseusd.ctl.jobs_cmd import accuracy_part
from perseusd.jobs.accuracy import (
    MIN_ITERATIONS,
    MIN_SAVING_ERROR_PTS,
    AccuracyCheck,
    profile_error_pct,
    saving_error_pts,
)
from perseusd.jobs.metering import MeasuredSaving
from perseusd.metrics.job_metrics import job_families
from tests.jobs.test_no_harm_core import _run_job
from tests.support.daemon_core import core_job, sim_core


def test_the_profile_error_is_the_rms_of_its_options_errors() -> None:
    assert profile_error_pct([0.01, 0.01, 0.02, math.inf]) == pytest.approx(100 * math.sqrt(0.0006 / 3))
    assert profile_error_pct([]) is None
    assert profile_error_pct([math.inf]) is None


def test_the_saving_error_grows_with_the_profile_error_and_has_a_floor() -> None:
    assert saving_error_pts(1.0, 15.0) == pytest.approx(2 * math.sqrt(2) * 0.85)
    assert saving_error_pts(0.1, 15.0) == MIN_SAVING_ERROR_PTS
    assert saving_error_pts(None, 15.0) == 2 * MIN_SAVING_ERROR_PTS


def test_a_shortfall_beyond_the_error_re_plans_once_then_keeps_the_plan() -> None:
    check = AccuracyCheck()
    assert check.judge(16.0, 11.0, 1.0, MIN_ITERATIONS - 1) is None  # too early to judge
    assert check.gap_pts == pytest.approx(5.0)
    assert check.action == ""
    assert check.judge(16.0, 15.5, 1.0, MIN_ITERATIONS) is None  # within its error
    scale = check.judge(16.0, 11.0, 1.0, MIN_ITERATIONS)
    assert scale is not None
    assert scale == pytest.approx(5.0 / check.error_pts)  # type: ignore[operator]
    assert check.action == "re-planned"
    assert check.judge(15.0, 10.0, 1.0, MIN_ITERATIONS) is None
    assert check.action == "kept"
    assert check.judge(15.0, 10.0, 1.0, MIN_ITERATIONS) is None
    assert AccuracyCheck().judge(16.0, 18.0, None, 50) is None  # saving more than predicted is no harm


def test_a_running_job_reports_its_error_and_is_re_planned_when_it_falls_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with sim_core(tmp_path, 2, model="h100_sxm") as core:
        _run_job(core, (0.7, 1.0), 8)
        manager = core.jobs
        assert manager is not None
        before = core_job(core)
        assert before.predicted_saving_pct is not None
        assert before.predicted_saving_pct > 0
        assert before.profile_error_pct is None  # an imported profile carries no error
        assert before.measured_saving_pct is None
        # The counters say the plan saves 5 points less than predicted (the measurement is the energy
        # counters' figure, replaced here: the simulated job sends no computations).
        all_max_j = 100.0
        short = all_max_j * (1 - (before.predicted_saving_pct - 5.0) / 100)
        iterations = float(MIN_ITERATIONS)
        monkeypatch.setattr(
            manager.deployment, "measured", lambda _job: MeasuredSaving(short, all_max_j, iterations)
        )
        job = next(iter(manager.jobs.values()))
        job.accuracy_checked_s = 0.0
        with caplog.at_level(logging.WARNING, logger="perseusd.jobs.deployment"):
            core.tick()
        after = core_job(core)
        assert after.accuracy_action == "re-planned"
        assert after.saving_error_pts == 2 * MIN_SAVING_ERROR_PTS
        assert after.measured_saving_pct == pytest.approx(before.predicted_saving_pct - 5.0, abs=1e-3)
        assert "re-planned with the profile's errors" in caplog.text
        assert after.profile_error_pct is None  # the profile's own error: the re-plan's scaling is not it
        assert "re-planned" in accuracy_part(after)
        assert "5.0 points short" in accuracy_part(after)
        names = {m.name: m for m in job_families([(after, 0, 0)])}
        kinds = {s.labels["kind"]: s.value for s in names["perseus_job_saving_percent"].samples}
        assert set(kinds) == {"predicted", "measured", "error_points"}
        job.accuracy_checked_s = 0.0
        core.tick()
        assert core_job(core).accuracy_action in ("re-planned", "kept")

"""A job's own error, known: its profile's estimated error, its predicted and measured saving, and what the
daemon does when the measured saving falls short of the prediction by more than that error.

- **Profile error** (`profile_error_pct`): the RMS of the relative standard errors of the profile's energies
  (online profiling's per-option errors, fitted clocks' included; None for an imported or cached profile,
  which carries none), as measured: a re-plan scales the errors it plans with, not this figure.
- **Saving error** (`saving_error_pts`): how far the measured saving may lie from the prediction by that
  error alone: the plan's and all-max's energies each off by the profile error, independently, at two
  standard errors: `200 x sqrt(2) x error x (1 - saving)` points, at least `MIN_SAVING_ERROR_PTS` (the
  counters' own spread over a short run). Unknown profile error: `MIN_SAVING_ERROR_PTS` x 2.
- **The check** (`AccuracyCheck.judge`), once the plan has run `MIN_ITERATIONS` iterations with both
  energies measured: gap = predicted - measured saving (points). A gap over the error means the profile is
  wrong by more than it says. The first time, the job is **re-planned**: the per-option errors are scaled by
  gap / error (at least 2), so the do-no-harm rule (`perseusd.jobs.no_harm`) runs one clock on every stage
  whose plan does not save measurably more than that larger error, and the measurement starts again. If the
  re-planned job still falls short, the check says so and keeps the plan (re-profiling is left to the user:
  `perseusctl profile import` of a profile measured offline). The log and `perseusctl jobs` say which.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

MIN_ITERATIONS = 25
"""Running iterations of a plan before its measured saving is judged (and a re-plan can follow). The measured
energy per iteration is the counters' mean power since the plan began times the mean of the iterations timed
since then (the last 20, `StageSlot.mean_iteration_time_s`), so it is reported from the first seconds of a
plan; it is judged only once the run is long enough for the counters' spread to be small against a saving."""
MIN_SAVING_ERROR_PTS = 1.0
REPLAN_MIN_SCALE = 2.0


def profile_error_pct(energy_rel_errs: Iterable[float]) -> float | None:
    """RMS of the profile's relative energy standard errors (`Job.energy_rel_err`'s values), in % (None:
    no errors known)."""
    finite = [e for e in energy_rel_errs if math.isfinite(e)]
    if not finite:
        return None
    return 100.0 * math.sqrt(sum(e * e for e in finite) / len(finite))


def saving_error_pts(error_pct: float | None, predicted_saving_pct: float) -> float:
    """Two standard errors of the predicted saving, in points (module docstring)."""
    if error_pct is None:
        return 2 * MIN_SAVING_ERROR_PTS
    share = max(0.0, 1.0 - predicted_saving_pct / 100.0)
    return max(MIN_SAVING_ERROR_PTS, 2.0 * math.sqrt(2.0) * error_pct * share)


@dataclass
class AccuracyCheck:
    """A job's prediction against its measurement (module docstring); reset when a new profile arrives."""

    profile_error_pct: float | None = None
    """The profile's own estimated error when it arrived (a re-plan scales the errors it plans with, not
    this)."""
    predicted_saving_pct: float | None = None
    measured_saving_pct: float | None = None
    error_pts: float | None = None
    action: str = ""
    """"", "re-planned" (the errors scaled, do no harm re-judged), or "kept" (still short after a re-plan)."""
    replans: int = 0

    @property
    def gap_pts(self) -> float | None:
        if self.predicted_saving_pct is None or self.measured_saving_pct is None:
            return None
        return self.predicted_saving_pct - self.measured_saving_pct

    def judge(
        self,
        predicted_saving_pct: float,
        measured_saving_pct: float,
        error_pct: float | None,
        iterations: float,
    ) -> float | None:
        """Record the figures; returns the factor to scale the profile's errors by when the job must be
        re-planned now (None: nothing to do)."""
        self.predicted_saving_pct = round(predicted_saving_pct, 3)
        self.measured_saving_pct = round(measured_saving_pct, 3)
        self.error_pts = round(saving_error_pts(error_pct, predicted_saving_pct), 3)
        gap = self.gap_pts
        if iterations < MIN_ITERATIONS or gap is None or gap <= self.error_pts or self.action == "kept":
            return None
        if self.replans == 0:
            self.replans = 1
            self.action = "re-planned"
            return max(REPLAN_MIN_SCALE, gap / self.error_pts)
        self.action = "kept"
        return None

"""When no frontier point fits a grant: power limits below the plans' peaks, sized on the jobs' DAGs.

A job's frontier ends at its least-energy point; a grant below what that point draws over the window used to
leave only strict limits (the same throttle as a uniform limit). A power limit is a clock ceiling that bites
the computations drawing the most: one level for the managed GPUs (each GPU at most its plan's peak), the
highest level whose modelled window power (`perseusd.power.limit_model`) of the jobs at their points, plus
the unmanaged GPUs at their allocations, fits the target, found by bisection; and the same with limits in
proportion to each GPU's peak (closer to one clock for all: a level slows the stages that draw the most,
which unbalances a pipeline). A job alone on the node tries `FIT_POINTS` of its points, not only its
slowest: a faster point under lower limits can beat the slowest one. The fastest fit wins; the slowdown is
modelled too, so status shows it. None when a job has no model or even the minimum limits do not fit
(then the limits are strict).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.power.cap_inputs import CapPoint, GpuRange, JobLoad

PEAK_MARGIN = 1.03
"""Window enforcement: a managed GPU's limit is its point's peak power times this (measurement noise)."""
FIT_POINTS = 12
"""One job alone on the node: the frontier points tried under limits (spread evenly in time)."""
BISECTION_STEPS = 30


@dataclass(frozen=True)
class LimitFit:
    limits_w: dict[str, float]
    time_s: dict[str, float]
    """Each job's modelled iteration time under the limits."""
    job_w: dict[str, float]
    """Each job's modelled worst window power (W)."""
    window_w: float
    """The node's modelled worst window power (W)."""
    points: dict[str, CapPoint]
    """The point each job runs under the limits."""


def fit_limits(
    gpus: Sequence[GpuRange],
    choices: Sequence[Sequence[tuple[JobLoad, CapPoint]]],
    unmanaged_w: float,
    target_w: float,
) -> LimitFit | None:
    """The fastest of `choices` (each: every job at a point) under limits that hold the node within
    `target_w`, each tried with one level and with limits in proportion to the GPUs' peaks (see the
    module); None when none fits."""
    best: tuple[float, LimitFit] | None = None
    for jobs in choices:
        for proportional in (False, True):
            fit = _fit(gpus, jobs, unmanaged_w, target_w, proportional)
            if fit is None:
                continue
            cost = sum(fit.time_s[job.name] / min(p.time_s for p in job.points) for job, _ in jobs)
            if best is None or cost < best[0]:
                best = (cost, fit)
    return None if best is None else best[1]


def _fit(
    gpus: Sequence[GpuRange],
    jobs: Sequence[tuple[JobLoad, CapPoint]],
    unmanaged_w: float,
    target_w: float,
    proportional: bool,
) -> LimitFit | None:
    models = [
        (job, point, job.limit_model(point.index)) for job, point in jobs if job.limit_model is not None
    ]
    if not jobs or len(models) != len(jobs) or any(m is None for _, _, m in models):
        return None
    by_gpu = {g.uuid: g for g in gpus}
    needs_w = {
        u: min(max(w * PEAK_MARGIN, by_gpu[u].min_w), by_gpu[u].max_w)
        for _, point in jobs
        for u, w in point.peak_w.items()
        if u in by_gpu
    }

    def limits_at(x: float) -> dict[str, float]:
        if proportional:  # x: the share of each GPU's need
            return {u: max(by_gpu[u].min_w, math.floor(w * x * 10) / 10) for u, w in needs_w.items()}
        level_w = math.floor(x * 10) / 10  # whole tenths: the same questions every time
        return {u: max(by_gpu[u].min_w, min(w, level_w)) for u, w in needs_w.items()}

    def total_w(limits: dict[str, float]) -> tuple[float, dict[str, tuple[float, float]]]:
        window_w, modelled = unmanaged_w, {}
        for job, _, model in models:
            assert model is not None
            modelled[job.name] = model.evaluate({u: limits[u] for u in job.gpus if u in limits})
            window_w += modelled[job.name][1]
        return window_w, modelled

    low, high = 0.0, 1.0 if proportional else max(needs_w.values(), default=0.0)
    if total_w(limits_at(low))[0] > target_w:
        return None
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if total_w(limits_at(middle))[0] <= target_w:
            low = middle
        else:
            high = middle
    limits = limits_at(low)
    window_w, modelled = total_w(limits)
    return LimitFit(
        limits,
        {n: t for n, (t, _) in modelled.items()},
        {n: w for n, (_, w) in modelled.items()},
        window_w,
        {job.name: point for job, point in jobs},
    )

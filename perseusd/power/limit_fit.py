"""When no frontier point fits a grant: power limits below the plans' peaks, sized on the jobs' DAGs.

A job's frontier ends at its least-energy point; a grant below what that point draws over the window used to
leave only strict limits (the same throttle as a uniform limit). A power limit is a clock ceiling that bites
the computations drawing the most: one level for the managed GPUs (each GPU at most its plan's peak), the
highest level whose modelled window power (`perseusd.power.limit_model`) of the jobs at their points, plus
the unmanaged GPUs at their allocations, fits the target, found by bisection. The slowdown is modelled too,
so status shows it. None when a job has no model or even the minimum limits do not fit (then the limits are
strict).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseusd.power.allocate import CapPoint, GpuRange, JobLoad

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


def fit_limits(
    gpus: Sequence[GpuRange],
    jobs: Sequence[tuple[JobLoad, CapPoint]],
    needs_w: Mapping[str, float],
    unmanaged_w: float,
    target_w: float,
) -> LimitFit | None:
    """Limits for the jobs' GPUs (at their points) holding the node within `target_w` (see the module)."""
    models = [
        (job, point, job.limit_model(point.index)) for job, point in jobs if job.limit_model is not None
    ]
    if not jobs or len(models) != len(jobs) or any(m is None for _, _, m in models):
        return None
    by_gpu = {g.uuid: g for g in gpus}
    managed = {u for job, _ in jobs for u in job.gpus if u in by_gpu}

    def limits_at(level_w: float) -> dict[str, float]:
        level_w = math.floor(level_w * 10) / 10  # whole tenths: the same questions every time
        return {u: max(by_gpu[u].min_w, min(needs_w[u], level_w)) for u in managed}

    def total_w(limits: dict[str, float]) -> tuple[float, dict[str, tuple[float, float]]]:
        window_w, modelled = unmanaged_w, {}
        for job, _, model in models:
            assert model is not None
            modelled[job.name] = model.evaluate({u: limits[u] for u in job.gpus if u in limits})
            window_w += modelled[job.name][1]
        return window_w, modelled

    low_w, high_w = 0.0, max((needs_w[u] for u in managed), default=0.0)
    if total_w(limits_at(low_w))[0] > target_w:
        return None
    for _ in range(BISECTION_STEPS):
        middle_w = (low_w + high_w) / 2
        if total_w(limits_at(middle_w))[0] <= target_w:
            low_w = middle_w
        else:
            high_w = middle_w
    limits = limits_at(low_w)
    window_w, modelled = total_w(limits)
    return LimitFit(
        limits, {n: t for n, (t, _) in modelled.items()}, {n: w for n, (_, w) in modelled.items()}, window_w
    )

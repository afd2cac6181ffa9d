"""The node cap's check: node power measured over the enforcement window corrects the plan.

`NodeCap` samples the energy counters into a `PowerWindow`; once a window, `MeasuredCheck.watch` compares
what it measured with the grant. A window above the grant trims the plan's target by the excess (a plan
switching clocks late draws more than its profile says); under `window` enforcement, a node still measured
above the grant + 1 % for `WATCHDOG_WINDOWS` windows in a row with the trim at its floor falls back to strict
limits (logged, and shown in status) until the cap changes (`reset`). Everything runs on the daemon's main
loop.
"""

from __future__ import annotations

import logging

from perseusd.cap.window import PowerWindow
from perseusd.power.allocate import PLAN_HEADROOM, CapAllocation

logger = logging.getLogger(__name__)

OVER_TOLERANCE = 0.01
WATCHDOG_WINDOWS = 3
TRIM_MIN = 0.85
TRIM_STEP = 0.97
"""The most one check trims the plan's target by."""
QUIET_WINDOWS = 3
"""Windows after a change of points or limits that the measured check ignores (jobs switch at an iteration
boundary; the window still holds the old power)."""
TRIM_RELAX = 1.002


class MeasuredCheck:
    """The trim of the plan's target and the fall-back to strict limits (see the module)."""

    def __init__(self, window: PowerWindow, window_s: float, gpus: int) -> None:
        self._window = window
        self._window_s = window_s
        self._gpus = gpus
        self.over_windows = 0
        self.forced_strict = False
        self.trim = 1.0
        self._next_check_s = 0.0
        self._quiet_until_s = 0.0

    def reset(self) -> None:
        """The cap changed (budget, grant, jobs, priorities): no trim, no fall-back, no window over."""
        self.trim = 1.0
        self.forced_strict = False
        self.over_windows = 0

    def after_plan(self, now_s: float, old: CapAllocation | None, new: CapAllocation) -> None:
        """A new allocation: when it moves a job or a limit, the windows measured next still hold the old
        plan's power, so they must not trim the new one."""
        if old is None or _moved(old, new):
            self._quiet_until_s = now_s + QUIET_WINDOWS * self._window_s

    def watch(self, now_s: float, grant_w: float) -> None:
        """Once a window, the measured power corrects the plan: above the grant, the plan's target is
        trimmed by the excess (down to `TRIM_MIN`); well below it, the trim relaxes slowly. Windows above the
        grant + 1 % with the trim at its floor fall back to strict limits after `WATCHDOG_WINDOWS`."""
        if now_s < max(self._next_check_s, self._quiet_until_s):
            return
        self._next_check_s = now_s + self._window_s
        reading = self._window.power()
        if reading is None or reading.gpus < self._gpus:
            return
        # The trim follows two windows: a counter that lags reads one window low and the next one high.
        steady = self._window.power(2 * self._window_s)
        if steady is not None and steady.gpus == self._gpus:
            if steady.power_w > grant_w:
                self.trim = max(TRIM_MIN, self.trim * max(TRIM_STEP, grant_w / steady.power_w))
            elif steady.power_w < grant_w * (1 - 2 * PLAN_HEADROOM):
                self.trim = min(1.0, self.trim * TRIM_RELAX)
        if reading.power_w > grant_w * (1 + OVER_TOLERANCE):
            self.over_windows += 1
            if self.over_windows >= WATCHDOG_WINDOWS and self.trim <= TRIM_MIN and not self.forced_strict:
                self.forced_strict = True
                logger.warning(
                    "power cap: %.0f W measured over %.1f s > grant %.0f W for %d windows: strict limits",
                    reading.power_w,
                    reading.span_s,
                    grant_w,
                    self.over_windows,
                )
        else:
            self.over_windows = 0


def _moved(old: CapAllocation, new: CapAllocation) -> bool:
    """Whether a new allocation changes a job's point or a limit by more than a watt."""
    if {g.name: g.index for g in old.jobs} != {g.name: g.index for g in new.jobs}:
        return True
    if old.limits_w.keys() != new.limits_w.keys():
        return True
    return any(abs(old.limits_w[u] - w) > 1.0 for u, w in new.limits_w.items())

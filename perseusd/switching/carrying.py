"""Which of a plan's computation events a client may carry (protocol 6.11; `perseus_client.carrying`).

A carried event reaches the daemon with the next event the client sends at once, and is applied then, in
order, with its own timestamp (the plan's pace and the job's records read timestamps, not arrival). So an
event may be carried when the plan does nothing on it whose moment matters (`gpu_plan.GpuPlan`):
- an end, when the next computation runs at the same clock (`on_end` submits nothing);
- a begin, when its computation runs at the clock of the one before it (the catch-up of `on_begin` submits
  nothing), no early lowering can be scheduled at it (the next computation is not lower), and no early raise
  can: its run is not followed by a higher clock, or the raise falls at least `RAISE_MARGIN` leads after it
  ends (an early raise is scheduled at the begin of the computation it falls in).
Step boundaries are never carried: they switch plans and move profiling on. A profiling GPU has no plan, so
none of its events is carried.
"""

from __future__ import annotations

from collections.abc import Sequence

RAISE_MARGIN = 2
"""A begin is carried only where its run's raise falls at least this many leads after the computation's
expected end: the pace (actual over profiled time) and the measured lead move while the plan runs."""


def carried_events(
    clocks_mhz: Sequence[int],
    times_ns: Sequence[int],
    run_left_ns: Sequence[int],
    after_run_mhz: Sequence[int],
    *,
    lead_ns: int,
    lowers_early: bool,
) -> list[tuple[bool, bool]]:
    """(begin carried, end carried) for each computation of a cyclic plan.

    `times_ns`: each computation's expected time (empty: the plan schedules no early change);
    `run_left_ns`, `after_run_mhz`: `plan_entries.run_ends` of the plan; `lead_ns`: how long before an
    expected end a change is submitted; `lowers_early`: whether the plan may lower early (it has slacks).
    """
    n = len(clocks_mhz)
    carried: list[tuple[bool, bool]] = []
    for i, clock_mhz in enumerate(clocks_mhz):
        previous_mhz, next_mhz = clocks_mhz[i - 1], clocks_mhz[(i + 1) % n]
        end = next_mhz == clock_mhz
        lowering = lowers_early and bool(times_ns) and next_mhz < clock_mhz
        raising = bool(times_ns) and _raise_may_fall_in(
            i, clock_mhz, times_ns, run_left_ns, after_run_mhz, lead_ns
        )
        carried.append((previous_mhz == clock_mhz and not lowering and not raising, end))
    return carried


def _raise_may_fall_in(
    i: int,
    clock_mhz: int,
    times_ns: Sequence[int],
    run_left_ns: Sequence[int],
    after_run_mhz: Sequence[int],
    lead_ns: int,
) -> bool:
    """Whether computation `i`'s begin may schedule its run's early raise."""
    if after_run_mhz[i] <= clock_mhz:
        return False
    return run_left_ns[i] - times_ns[i] < RAISE_MARGIN * lead_ns

"""Several simulated GPUs running one computation together, in step (a tensor-parallel stage), on one thread.

`run_together` is `SimGpuHandle.run` for a group: every GPU starts the computation at once at its own clock
(the daemon's lock, power-capped where the board caps), is polled for clock or power-limit changes (applied
to its work left, as on a real GPU), and records its time and energy; the call returns when the slowest GPU
has finished, as the GPUs of a stage meet at every layer's collective. One thread polls them all, so a group
of N GPUs costs the workload process what one GPU does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from perseusd.gpu.sim_shared import BusyState, ControlState
from perseusd.workload.sim_workload import RunRecord, SimGpuHandle, _fold_stale


@dataclass
class _Running:
    """One GPU's part of the computation under way."""

    handle: SimGpuHandle
    done: BusyState
    control: ControlState
    start_s: float
    first_mhz: int
    first_clock_mhz: int
    first_capped: bool
    clock_mhz: int
    capped: bool
    segment_start_s: float
    segment_s: float
    segment_j: float
    work_left: float = 1.0
    switches: int = 0
    busy_s: float = 0.0
    energy_j: float = 0.0
    finished: bool = False


def run_together(
    handles: Sequence[SimGpuHandle], stage: int, instruction: str, time_scale: float = 1.0
) -> list[RunRecord]:
    """Run one computation on every GPU of `handles` at once; each GPU's record, in order (see module)."""
    with contextlib.ExitStack() as held:
        for handle in handles:
            held.enter_context(handle._busy.exclusive())
        running = [_start(handle, stage, instruction, time_scale) for handle in handles]
        while not all(r.finished for r in running):
            clock, sleep = handles[0]._clock, handles[0]._sleep
            ends = [r.segment_start_s + r.segment_s for r in running if not r.finished]
            poll_s = handles[0]._clock_poll_s
            left_s = min(ends) - clock()
            if left_s > 0:
                sleep(left_s if poll_s is None else min(poll_s, left_s))
            for r in running:
                if not r.finished:
                    _poll(r, stage, instruction, time_scale)
        return [_record(r, stage, instruction) for r in running]


def _start(handle: SimGpuHandle, stage: int, instruction: str, time_scale: float) -> _Running:
    done = _fold_stale(handle._busy.read())
    start_s = handle._clock()
    control = handle._state.read_control()
    cost = handle._run_cost(stage, instruction, control)
    running = _Running(
        handle=handle,
        done=done,
        control=control,
        start_s=start_s,
        first_mhz=handle._target_mhz(control),
        first_clock_mhz=cost.clock_mhz,
        first_capped=cost.capped,
        clock_mhz=cost.clock_mhz,
        capped=cost.capped,
        segment_start_s=start_s,
        segment_s=0.0,
        segment_j=0.0,
        busy_s=done.done_busy_s,
        energy_j=done.done_energy_j,
    )
    _segment(running, cost.cost.time_s, cost.cost.energy_j, time_scale)
    return running


def _segment(r: _Running, time_s: float, energy_j: float, time_scale: float) -> None:
    """Start the GPU's next segment of work at its current clock (the work left at that clock's cost)."""
    scale = time_scale * r.handle._throttle * r.work_left
    r.segment_s, r.segment_j = time_s * scale, energy_j * scale
    busy = BusyState(r.busy_s, r.energy_j, True, r.segment_start_s, r.segment_s, r.segment_j, r.clock_mhz)
    r.handle._busy.write(replace(busy, active_capped=r.capped))


def _poll(r: _Running, stage: int, instruction: str, time_scale: float) -> None:
    """Finish the GPU's segment when its time is up, or start a new one when its clock or limit changed."""
    now_s = r.handle._clock()
    end_s = r.segment_start_s + r.segment_s
    if now_s >= end_s:
        r.busy_s, r.energy_j = r.busy_s + r.segment_s, r.energy_j + r.segment_j
        r.finished = True
        last = BusyState(r.busy_s, r.energy_j, active_clock_mhz=r.clock_mhz, active_capped=r.capped)
        r.handle._busy.write(last)
        return
    control = r.handle._state.read_control()
    if (control.locked_sm_clock_mhz, control.power_limit_w) == (
        r.control.locked_sm_clock_mhz,
        r.control.power_limit_w,
    ):
        return
    fraction = min(1.0, max(0.0, (now_s - r.segment_start_s) / r.segment_s)) if r.segment_s > 0 else 1.0
    r.busy_s, r.energy_j = r.busy_s + fraction * r.segment_s, r.energy_j + fraction * r.segment_j
    r.work_left *= 1.0 - fraction
    r.control, r.segment_start_s, r.switches = control, now_s, r.switches + 1
    cost = r.handle._run_cost(stage, instruction, control)
    r.clock_mhz, r.capped = cost.clock_mhz, cost.capped
    _segment(r, cost.cost.time_s, cost.cost.energy_j, time_scale)


def _record(r: _Running, stage: int, instruction: str) -> RunRecord:
    end_s = r.segment_start_s + r.segment_s
    duration_s = end_s - r.start_s if r.switches else r.busy_s - r.done.done_busy_s
    record = RunRecord(
        stage, instruction, r.first_mhz, r.start_s, duration_s, r.energy_j - r.done.done_energy_j, r.switches
    )
    return replace(record, ran_mhz=r.first_clock_mhz, capped=r.first_capped)

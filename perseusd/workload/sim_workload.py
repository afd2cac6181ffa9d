"""The workload side of a simulated GPU: what an emulated training process uses instead of a real GPU.

A workload process opens a simulated GPU by UUID in the daemon's sim directory with its own profile (any
profile in the shared CSV format whose clocks the board supports; see `perseusd.workload.sim_costs` for how
clocks the profile lacks are filled in), then runs computations on it: `run(stage, instruction)` looks up the
profile's time and energy at the clock in force (the daemon's locked clock, or the highest clock when
unlocked; lower if the board's power cap says so), holds the GPU for that time (a clock or power limit changed
while it runs applies to the work left; computations on one GPU never overlap: a second process waits, as
contexts time-slice on a real GPU) and records the computation, so the daemon's energy counter sees it. A
workload maps the daemon's control file read-only: it can never change clocks. The file layout is documented
in `perseusd.gpu.sim_shared`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from perseus_client.closing import Closing

from perseusd.gpu.errors import GpuInvalidArgumentError
from perseusd.gpu.sim_boards import load_board
from perseusd.gpu.sim_shared import BusyMap, BusyState, ControlState, StateMap, busy_path, state_path
from perseusd.planner.profile import Profile
from perseusd.workload.sim_costs import ComputationCost, RunCost, WorkloadCosts

DEFAULT_CLOCK_POLL_S = 0.001


@dataclass(frozen=True)
class RunRecord:
    """One computation run on a simulated GPU."""

    stage: int
    instruction: str
    clock_mhz: int
    start_s: float
    duration_s: float
    energy_j: float
    clock_switches: int = 0  # clock changes the daemon made while it ran (clock_mhz is the first clock)
    ran_mhz: int = 0  # the clock it began running at: clock_mhz, or lower when power-capped
    capped: bool = False  # the power cap lowered its clock (at its start)
    gpu_energy_j: float | None = None  # the GPU's exact energy since its creation as it began (J, no noise)


def list_sim_gpus(sim_dir: Path | str) -> list[str]:
    """UUIDs of the simulated GPUs in `sim_dir`, sorted."""
    return sorted(path.name.removesuffix(".state") for path in Path(sim_dir).glob("GPU-*.state"))


class SimGpuHandle(Closing):
    """A workload process's handle on one simulated GPU. Open it with `SimGpuHandle.open`."""

    def __init__(
        self,
        state: StateMap,
        busy: BusyMap,
        costs: WorkloadCosts,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        clock_poll_s: float | None = DEFAULT_CLOCK_POLL_S,
    ) -> None:
        self._state = state
        self._busy = busy
        self._costs = costs
        self._clock = clock
        self._sleep = sleep
        self._throttle = 1.0
        self._clock_poll_s = clock_poll_s

    @classmethod
    def open(
        cls,
        sim_dir: Path | str,
        uuid: str,
        profile: Profile | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        clock_poll_s: float | None = DEFAULT_CLOCK_POLL_S,
    ) -> SimGpuHandle:
        """Open simulated GPU `uuid` in `sim_dir` (control file read-only, busy record writable).

        `profile`: the workload's per-clock costs; None: the profile bundled under the board's name (the
        GPT-3 ones for `a100_sxm` and `a40`, the GPT 4-stage one for `h100_sxm`). Raises
        `GpuInvalidArgumentError` if the profile has clocks the board does not support.
        `clock_poll_s`: how often a running computation looks for a clock change (None: only at its start).
        """
        sim_dir = Path(sim_dir)
        try:
            state = StateMap(state_path(sim_dir, uuid), writable=False)
        except (OSError, ValueError) as error:
            raise GpuInvalidArgumentError(f"no simulated GPU here ({error})", uuid=uuid, op="open") from error
        try:
            board = load_board(state.header.model)
            if profile is None:
                from perseusd.planner.bundled import bundled_profile

                profile = bundled_profile(board.name)
            costs = WorkloadCosts(profile, board)
            busy = BusyMap(busy_path(sim_dir, uuid), writable=True)
        except BaseException:
            state.close()
            raise
        return cls(state, busy, costs, clock=clock, sleep=sleep, clock_poll_s=clock_poll_s)

    @property
    def uuid(self) -> str:
        return self._state.header.uuid

    @property
    def costs(self) -> WorkloadCosts:
        """The workload's costs at every clock of the board."""
        return self._costs

    def current_clock_mhz(self) -> int:
        """The clock in force now (MHz): the locked clock, or the highest clock when unlocked."""
        return self._target_mhz(self._state.read_control())

    def _target_mhz(self, control: ControlState) -> int:
        locked_mhz = control.locked_sm_clock_mhz
        return locked_mhz if locked_mhz is not None else self._costs.board.max_clock_mhz

    def power_limit_w(self) -> float:
        """The power limit the daemon set (W): on boards that cap, computations above it run slower."""
        return self._state.read_control().power_limit_w

    def _run_cost(self, stage: int, instruction: str, control: ControlState) -> RunCost:
        return self._costs.run_cost(stage, instruction, self._target_mhz(control), control.power_limit_w)

    def throttle(self, factor: float) -> None:
        """Make every later computation `factor` times longer at the same power (straggler emulation)."""
        if factor <= 0:
            raise GpuInvalidArgumentError(
                f"throttle factor {factor} must be > 0", uuid=self.uuid, op="throttle"
            )
        self._throttle = factor

    def cost(self, stage: int, instruction: str, time_scale: float = 1.0) -> ComputationCost:
        """What `run` would take now: time (s) and energy (J) at the current clock (power-capped), throttle
        and scale in."""
        base = self._run_cost(stage, instruction, self._state.read_control()).cost
        scale = time_scale * self._throttle
        return ComputationCost(time_s=base.time_s * scale, energy_j=base.energy_j * scale)

    def run(self, stage: int, instruction: str, time_scale: float = 1.0) -> RunRecord:
        """Run one computation: hold the GPU for its profiled time and record its energy.

        `time_scale` multiplies time and energy alike (power stays the profile's): use it to emulate faster
        than real time. The clock is read when the computation starts (after waiting for the GPU) and then
        every `clock_poll_s` while it runs: a clock the daemon changes mid-computation applies to the work
        left, as on a real GPU, so time and energy are piecewise (work done at each clock is pro rata).
        """
        if time_scale <= 0:
            raise GpuInvalidArgumentError(f"time_scale {time_scale} must be > 0", uuid=self.uuid, op="run")
        with self._busy.exclusive():
            done = _fold_stale(self._busy.read())
            start_s = self._clock()
            control = self._state.read_control()
            first, first_mhz = self._run_cost(stage, instruction, control), self._target_mhz(control)
            run, work_left, segment_start_s, switches = first, 1.0, start_s, 0
            busy_s, energy_j = done.done_busy_s, done.done_energy_j
            begun_j = energy_j + control.idle_energy_j(start_s, busy_s, self._idle_power_w(control))
            while True:
                scale = time_scale * self._throttle * work_left
                seg_s, seg_j = run.cost.time_s * scale, run.cost.energy_j * scale
                active = BusyState(busy_s, energy_j, True, segment_start_s, seg_s, seg_j, run.clock_mhz)
                self._busy.write(replace(active, active_capped=run.capped))
                new_control = self._hold(segment_start_s + seg_s, control)
                if new_control is None:
                    busy_s, energy_j = busy_s + seg_s, energy_j + seg_j
                    break
                now_s = self._clock()
                fraction = min(1.0, max(0.0, (now_s - segment_start_s) / seg_s)) if seg_s > 0 else 1.0
                busy_s, energy_j = busy_s + fraction * seg_s, energy_j + fraction * seg_j
                work_left *= 1.0 - fraction
                control, segment_start_s, switches = new_control, now_s, switches + 1
                run = self._run_cost(stage, instruction, control)
            last = BusyState(busy_s, energy_j, active_clock_mhz=run.clock_mhz, active_capped=run.capped)
            self._busy.write(last)
        duration_s = self._clock() - start_s if switches else busy_s - done.done_busy_s
        total_j = energy_j - done.done_energy_j
        record = RunRecord(stage, instruction, first_mhz, start_s, duration_s, total_j, switches)
        return replace(record, ran_mhz=first.clock_mhz, capped=first.capped, gpu_energy_j=begun_j)

    def _idle_power_w(self, control: ControlState) -> float:
        return self._costs.board.idle_power_w(control.locked_sm_clock_mhz)

    def _hold(self, end_s: float, control: ControlState) -> ControlState | None:
        """Sleep until `end_s`; the new control if the daemon changes the clock or power limit before then."""
        if self._clock_poll_s is None:
            self._sleep(max(0.0, end_s - self._clock()))
            return None
        while (left_s := end_s - self._clock()) > 0:
            self._sleep(min(self._clock_poll_s, left_s))
            now = self._state.read_control()
            changed = (now.locked_sm_clock_mhz, now.power_limit_w) != (
                control.locked_sm_clock_mhz,
                control.power_limit_w,
            )
            if changed and end_s - self._clock() > 0:
                return now
        return None

    def close(self) -> None:
        self._state.close()
        self._busy.close()


def _fold_stale(busy: BusyState) -> BusyState:
    """A record left active by a workload that died mid-computation counts as finished."""
    if not busy.active:
        return busy
    return BusyState(busy.done_busy_s + busy.active_duration_s, busy.done_energy_j + busy.active_energy_j)

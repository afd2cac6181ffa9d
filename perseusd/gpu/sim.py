"""Simulated GPUs: product code (`perseusd --backend sim`) that behaves like the boards it was measured on.

Each simulated GPU is a board of `perseusd.gpu.sim_boards` (`a100_sxm`, `a40`, `h100_sxm`): NVML's facts
(name, supported clocks, power-limit range) and how the silicon responds (idle power per locked clock, the
energy counter's period and noise, how long clock locks and power limits take, power capping). A board carries
no workload: workload processes (`perseusd.workload.sim_workload`) bring their own profile. The GPU's state
lives in two small shared-memory files in the sim directory (layout: `perseusd.gpu.sim_shared`):

- the daemon side (`SimDevice`) writes the locked clock and the power limit; workloads can only read them.
  A setter blocks its caller as NVML's does on the board: a clock lock on `h100_sxm` takes 9-15 ms and the
  new clock acts part-way through the call; a power limit acts when the call returns;
- workloads record their computations (time and energy from their profile at the clock in force, power-capped
  on boards that cap, and the clock they actually ran at); the energy counter is the busy energy they recorded
  plus the board's idle power, which follows the locked clock, over the remaining (idle) time;
- the counter is published like NVML's: it changes only once per update period (the board's, 100 ms), each
  increment with gaussian noise (1 % of the increment); instant power gets the same relative noise;
- an unlocked GPU runs at its highest clock; `sm_clock_mhz` and `clock_event_reasons` report the clock the
  last computation ran at and whether the power cap lowered it;
- a GPU keeps its state across daemon restarts (like real hardware): an existing valid file is reused unless
  `fresh=True`.

Deterministic for a given seed and sequence of calls; the time source (`clock`, CLOCK_MONOTONIC by default,
which every process of the node shares) and `sleep` are injectable so tests can be exact.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from perseusd.gpu.backend import CLOCK_EVENT_SW_POWER_CAP, GpuBackend, GpuDevice, GpuInfo
from perseusd.gpu.clocks import clamp, snap_clock_mhz
from perseusd.gpu.errors import GpuInvalidArgumentError
from perseusd.gpu.sim_boards import Board, load_board
from perseusd.gpu.sim_faults import FaultSet, SimFault
from perseusd.gpu.sim_shared import (
    BusyMap,
    ControlState,
    StateHeader,
    StateMap,
    busy_path,
    create_gpu_files,
    state_path,
)

logger = logging.getLogger(__name__)

_TIME_EPSILON_S = 1e-9
"""Times this close count as equal (float sums of periods are inexact)."""
_SIM_NAMESPACE = uuidlib.UUID("6f1c1d4e-5a2b-4c7d-9e3f-70657273656e")


def sim_uuid(model: str, index: int) -> str:
    """The stable UUID of simulated GPU `index` of `model`, formatted like NVML's: "GPU-xxxxxxxx-..."."""
    return f"GPU-{uuidlib.uuid5(_SIM_NAMESPACE, f'perseus-sim/{model}/{index}')}"


class SimDevice(GpuDevice):
    """One simulated GPU, daemon side. Not thread-safe: use it from one owner thread."""

    def __init__(
        self,
        info: GpuInfo,
        board: Board,
        state: StateMap,
        busy: BusyMap,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        update_period_s: float,
        noise: float,
        rng: random.Random,
        latency_rng: random.Random | None = None,
    ) -> None:
        self._info = info
        self._board = board
        self._sleep = sleep
        self._latency_rng = latency_rng if latency_rng is not None else random.Random(0)
        self._state = state
        self._busy = busy
        self._clock = clock
        self._update_period_s = update_period_s
        self._noise = noise
        self._rng = rng
        self._faults = FaultSet(info.uuid, sleep)
        self._created_s = state.header.created_s
        now_s = clock()
        self._published_true_j = self._true_energy_j(now_s)
        self._published_j = self._published_true_j
        self._next_publish_s = self._boundary_after(now_s)

    @property
    def info(self) -> GpuInfo:
        return self._info

    @property
    def board(self) -> Board:
        return self._board

    # Fault injection.

    def inject_fault(self, op: str, kind: str, delay_s: float = 0.0, error: str = "unknown") -> None:
        """Inject a fault (see `perseusd.gpu.sim_faults.SimFault`); it stays until `clear_faults`."""
        self.add_fault(SimFault(op=op, kind=kind, delay_s=delay_s, error=error))

    def add_fault(self, fault: SimFault) -> None:
        self._faults.add(fault)

    def clear_faults(self) -> None:
        self._faults.clear()

    # The contract.

    def set_locked_sm_clock_mhz(self, clock_mhz: int) -> int:
        self._faults.check("set_locked_sm_clock_mhz")
        applied_mhz = snap_clock_mhz(self._info.supported_sm_clocks_mhz, clock_mhz)
        self._lock(applied_mhz)
        return applied_mhz

    def reset_locked_sm_clock(self) -> None:
        self._faults.check("reset_locked_sm_clock")
        self._lock(None)

    def _lock(self, locked_mhz: int | None) -> None:
        """Block like the board's setter; the new clock acts part-way through the call."""
        act_s, call_s = self._board.clock_lock.draw(self._latency_rng)
        if act_s > 0:
            self._sleep(act_s)
        control = self._state.read_control()
        if control.locked_sm_clock_mhz != locked_mhz:
            control = self._fold_idle(control, self._clock())
        self._state.write_control(replace(control, locked_sm_clock_mhz=locked_mhz))
        if call_s > act_s:
            self._sleep(call_s - act_s)

    def locked_sm_clock_mhz(self) -> int | None:
        self._faults.check("locked_sm_clock_mhz")
        return self._state.read_control().locked_sm_clock_mhz

    def sm_clock_mhz(self) -> int:
        """The clock the GPU runs at: the power-capped clock of the running (or last) computation, if capped
        below the lock; else the locked clock, or the highest when unlocked."""
        self._faults.check("sm_clock_mhz")
        capped_mhz = self._capped_clock_mhz()
        return capped_mhz if capped_mhz is not None else self._target_clock_mhz()

    def clock_event_reasons(self) -> int:
        """`CLOCK_EVENT_SW_POWER_CAP` while the power cap holds the clock below the lock, else 0."""
        self._faults.check("clock_event_reasons")
        return CLOCK_EVENT_SW_POWER_CAP if self._capped_clock_mhz() is not None else 0

    def _target_clock_mhz(self) -> int:
        locked_mhz = self._state.read_control().locked_sm_clock_mhz
        return locked_mhz if locked_mhz is not None else self._info.supported_sm_clocks_mhz[0]

    def _capped_clock_mhz(self) -> int | None:
        """The clock the last computation ran at when the power cap held it below the clock in force."""
        busy = self._busy.read()
        if busy.active_capped and 0 < busy.active_clock_mhz < self._target_clock_mhz():
            return busy.active_clock_mhz
        return None

    def set_power_limit_w(self, limit_w: float) -> float:
        self._faults.check("set_power_limit_w")
        if not math.isfinite(limit_w):
            raise GpuInvalidArgumentError(
                f"power limit {limit_w} W", uuid=self._info.uuid, op="set_power_limit_w"
            )
        enforced_w = clamp(limit_w, self._info.power_limit_min_w, self._info.power_limit_max_w)
        control = self._state.read_control()
        if enforced_w != control.power_limit_w:
            lowering = enforced_w < control.power_limit_w
            act_s = self._board.power_limit_lower_s if lowering else self._board.power_limit_raise_s
            if act_s > 0:
                self._sleep(act_s)
            control = self._state.read_control()
        self._state.write_control(replace(control, power_limit_w=enforced_w))
        return enforced_w

    def power_limit_w(self) -> float:
        self._faults.check("power_limit_w")
        return self._state.read_control().power_limit_w

    def energy_mj(self) -> int:
        self._faults.check("energy_mj")
        now_s = self._clock()
        if now_s >= self._next_publish_s - _TIME_EPSILON_S:
            self._publish(now_s)
        return round(self._published_j * 1000.0)

    def power_w(self) -> float:
        self._faults.check("power_w")
        now_s = self._clock()
        busy = self._busy.read()
        if busy.running_at(now_s) and busy.active_duration_s > 0:
            true_w = busy.active_energy_j / busy.active_duration_s
        else:
            true_w = self._board.idle_power_w(self._state.read_control().locked_sm_clock_mhz)
        return max(0.0, true_w * self._noise_factor())

    # Energy model.

    def true_energy_j(self) -> float:
        """The exact (noise-free, unpublished) energy since creation (J), for tests and diagnostics."""
        return self._true_energy_j(self._clock())

    def _true_energy_j(self, now_s: float) -> float:
        control = self._state.read_control()
        busy_s, busy_j = self._busy.read().busy_at(now_s)
        return busy_j + self._idle_energy_j(control, now_s, busy_s)

    def _idle_energy_j(self, control: ControlState, now_s: float, busy_s: float) -> float:
        """Idle energy since creation: folded up to the last clock change, then at this clock's power."""
        return control.idle_energy_j(now_s, busy_s, self._board.idle_power_w(control.locked_sm_clock_mhz))

    def _fold_idle(self, control: ControlState, now_s: float) -> ControlState:
        """`control` with the idle energy up to `now_s` folded in (before the clock changes)."""
        busy_s, _ = self._busy.read().busy_at(now_s)
        folded_j = self._idle_energy_j(control, now_s, busy_s)
        return replace(control, idle_folded_j=folded_j, folded_at_s=now_s, folded_busy_s=busy_s)

    def _boundary_after(self, now_s: float) -> float:
        periods = math.floor((now_s - self._created_s + _TIME_EPSILON_S) / self._update_period_s) + 1
        return self._created_s + periods * self._update_period_s

    def _publish(self, now_s: float) -> None:
        true_j = self._true_energy_j(now_s)
        increment_j = true_j - self._published_true_j
        self._published_j += max(0.0, increment_j * self._noise_factor())
        self._published_true_j = true_j
        self._next_publish_s = self._boundary_after(now_s)

    def _noise_factor(self) -> float:
        return 1.0 + self._noise * self._rng.gauss(0.0, 1.0) if self._noise > 0 else 1.0

    def close(self) -> None:
        self._state.close()
        self._busy.close()


class SimBackend(GpuBackend):
    """`gpus` simulated GPUs of one model, with their shared state in `sim_dir`.

    Args:
        sim_dir: where the GPU files live (created if missing, mode 0755); None: a private temporary
            directory, removed on `close`.
        gpus: how many GPUs.
        model: the board, one of `perseusd.gpu.sim_boards.BOARD_NAMES` ("a100_sxm", "a40", "h100_sxm").
        update_period_s: the energy counter's update period (s); None: the board's.
        noise: relative standard deviation of the gaussian noise on each counter increment and on power;
            None: the board's.
        seed: seeds the noise (GPU i uses seed * 1000 + i).
        clock, sleep: the time source (s) and sleep function; CLOCK_MONOTONIC and `time.sleep` by default.
        faults: faults to inject from the start (`SimFault.gpu` None: every GPU).
        state_mode, busy_mode: file modes of the `.state` and `.busy` files; workloads of other users need
            read access to both and write access to `.busy`.
        fresh: recreate every GPU's files (zero energy, unlocked, default power limit), never reuse them.
        first_index: the index of the first GPU (GPU i is `first_index + i`, its UUID derived from that): a
            mixed backend (`perseusd.gpu.mixed`) numbers its simulated GPUs after the real ones.
    """

    def __init__(
        self,
        sim_dir: Path | None = None,
        *,
        gpus: int = 1,
        model: str = "a100_sxm",
        update_period_s: float | None = None,
        noise: float | None = None,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        faults: Sequence[SimFault] = (),
        state_mode: int = 0o644,
        busy_mode: int = 0o644,
        fresh: bool = False,
        first_index: int = 0,
    ) -> None:
        self._board = load_board(model)
        if update_period_s is None:
            update_period_s = self._board.counter_period_s
        if noise is None:
            noise = self._board.counter_noise
        if gpus < 0 or update_period_s <= 0 or noise < 0 or first_index < 0:
            raise GpuInvalidArgumentError(
                "need gpus >= 0, update_period_s > 0, noise >= 0 and first_index >= 0", op="sim_init"
            )
        self._owned_dir = sim_dir is None
        self.sim_dir = Path(tempfile.mkdtemp(prefix="perseusd-sim-")) if sim_dir is None else Path(sim_dir)
        self.sim_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._clock = clock
        self._sleep = sleep
        self._modes = (state_mode, busy_mode)
        self._devices: list[SimDevice] = []
        for index in range(first_index, first_index + gpus):
            device = self._open_device(index, fresh=fresh, period_s=update_period_s, noise=noise, seed=seed)
            for fault in faults:
                if fault.gpu is None or fault.gpu == index:
                    device.add_fault(fault)
            self._devices.append(device)

    def _info(self, index: int, uuid: str) -> GpuInfo:
        board = self._board
        return GpuInfo(
            uuid=uuid,
            index=index,
            name=board.gpu_name,
            pci_bus_id=f"00000000:{0x80 + index:02X}:00.0",
            supported_sm_clocks_mhz=board.clocks_mhz,
            power_limit_min_w=board.power_limit_min_w,
            power_limit_max_w=board.power_limit_max_w,
            power_limit_default_w=board.power_limit_default_w,
            energy_counter_supported=True,
            device_minor=index,
        )

    def _open_device(self, index: int, *, fresh: bool, period_s: float, noise: float, seed: int) -> SimDevice:
        info = self._info(index, sim_uuid(self._board.name, index))
        maps = None if fresh else self._reuse(info)
        if maps is None:
            created_s = self._clock()
            header = StateHeader(uuid=info.uuid, model=self._board.name, created_s=created_s)
            control = ControlState(None, info.power_limit_default_w, folded_at_s=created_s)
            create_gpu_files(
                self.sim_dir, header, control, state_mode=self._modes[0], busy_mode=self._modes[1]
            )
            maps = self._map(info.uuid)
        state, busy = maps
        return SimDevice(
            info,
            self._board,
            state,
            busy,
            clock=self._clock,
            sleep=self._sleep,
            update_period_s=period_s,
            noise=noise,
            rng=random.Random(seed * 1000 + index),
            latency_rng=random.Random(f"{seed}/{index}/latency"),
        )

    def _map(self, uuid: str) -> tuple[StateMap, BusyMap]:
        state = StateMap(state_path(self.sim_dir, uuid), writable=True)
        try:
            return state, BusyMap(busy_path(self.sim_dir, uuid), writable=False)
        except BaseException:
            state.close()
            raise

    def _reuse(self, info: GpuInfo) -> tuple[StateMap, BusyMap] | None:
        """The existing files of this GPU when valid (same UUID, model and layout, not from a past boot)."""
        try:
            state, busy = self._map(info.uuid)
        except (OSError, ValueError):
            return None
        header = state.header
        if (
            header.uuid == info.uuid
            and header.model == self._board.name
            and header.created_s <= self._clock()
        ):
            logger.info("reusing simulated GPU %s from %s", info.uuid, self.sim_dir)
            return state, busy
        state.close()
        busy.close()
        return None

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def sim_devices(self) -> list[SimDevice]:
        """The devices with their simulation-only methods (fault injection)."""
        return list(self._devices)

    def close(self) -> None:
        for device in self._devices:
            device.close()
        self._devices = []
        if self._owned_dir:
            shutil.rmtree(self.sim_dir, ignore_errors=True)

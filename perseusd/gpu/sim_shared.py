"""Shared-memory state of one simulated GPU, so that separate workload processes can use it like a real GPU.

Each simulated GPU has two small fixed-layout files in the sim directory (the daemon uses
`<runtime_dir>/sim`), each mapped with `mmap` by the daemon and by workload processes. All integers and floats
are little-endian.

`<uuid>.state` (160 bytes), written only by the daemon; workloads map it read-only, so they can never change
the clock::

    offset size  field
         0    8  magic b"PRSGPU01"
         8    4  layout version (u32) = 2
        16   64  GPU UUID (ASCII, NUL padded)
        80   16  board name (ASCII, NUL padded), e.g. "a100_sxm" (`perseusd.gpu.sim_boards`)
        96    8  created_s (f64): CLOCK_MONOTONIC when the GPU was created: energy counts from here
       104    4  control seqlock counter (u32; odd while the daemon writes)
       108    4  locked SM clock (u32 MHz; 0 = not locked)
       112    8  power limit (f64 W)
       120    8  idle_folded_j (f64): idle energy up to folded_at_s (idle power depends on the clock)
       128    8  folded_at_s (f64): when the idle energy was last folded (at every clock change)
       136    8  folded_busy_s (f64): busy time of the workloads at folded_at_s

`<uuid>.busy` (64 bytes), written only by workload processes (each holds an exclusive `flock` on the file
while its computation runs, so computations on one GPU never overlap); the daemon maps it read-only::

    offset size  field
         0    8  magic b"PRSBUSY1"
         8    4  busy seqlock counter (u32; odd while a workload writes)
        12    4  active (u32): 1 while a computation runs
        16    8  done_busy_s (f64): total time of finished computations
        24    8  done_energy_j (f64): total energy of finished computations
        32    8  active_start_s (f64): start of the running computation (CLOCK_MONOTONIC)
        40    8  active_duration_s (f64)
        48    8  active_energy_j (f64)
        56    4  active clock (u32 MHz): the clock the computation runs at (lower than the lock if capped);
                 kept when it ends, as the clock the GPU last ran at
        60    4  active capped (u32): 1 if that computation is power-capped (kept when it ends)

Each section has one writer at a time and is guarded by a seqlock: the writer makes the counter odd, writes,
then makes it even; a reader retries while the counter is odd or changed under it. Aligned 4- and 8-byte
stores through `struct.pack_into` are atomic enough on x86-64 and the counter makes torn reads visible. A
writer that died mid-write leaves the counter odd: readers give up retrying after a bound and the next writer
repairs it. Files are created atomically (written to a temporary name, then renamed) so nobody maps half a
file.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_MAGIC = b"PRSGPU01"
BUSY_MAGIC = b"PRSBUSY1"
LAYOUT_VERSION = 2
STATE_SIZE = 160
BUSY_SIZE = 64
_HEADER = struct.Struct("<8sI4x64s16sd")
_CONTROL = struct.Struct("<Idddd")  # locked MHz, power limit W, idle folded J, folded at s, folded busy s
_CONTROL_SEQ_OFFSET = 104
_CONTROL_OFFSET = 108
_BUSY = struct.Struct("<IdddddII")  # active, done s, done J, start s, duration s, energy J, clock MHz, capped
_BUSY_SEQ_OFFSET = 8
_BUSY_OFFSET = 12
_SEQ = struct.Struct("<I")
_READ_RETRIES = 10_000


@dataclass(frozen=True)
class StateHeader:
    """The fixed facts of a simulated GPU file."""

    uuid: str
    model: str
    created_s: float


@dataclass(frozen=True)
class ControlState:
    """What the daemon controls: the locked SM clock (MHz, None = not locked) and the power limit (W), and
    the idle energy accounted up to the last clock change (idle power depends on the clock)."""

    locked_sm_clock_mhz: int | None
    power_limit_w: float
    idle_folded_j: float = 0.0
    folded_at_s: float = 0.0
    folded_busy_s: float = 0.0

    def idle_energy_j(self, now_s: float, busy_s: float, idle_power_w: float) -> float:
        """Idle energy since creation at `now_s`, the workloads busy `busy_s` in all by then: folded up to the
        last clock change, then at `idle_power_w` (the board's at the clock locked now)."""
        idle_s = max(0.0, (now_s - self.folded_at_s) - (busy_s - self.folded_busy_s))
        return self.idle_folded_j + idle_s * idle_power_w


@dataclass(frozen=True)
class BusyState:
    """What workloads have run: finished computations in total, and the one running (if any)."""

    done_busy_s: float = 0.0
    done_energy_j: float = 0.0
    active: bool = False
    active_start_s: float = 0.0
    active_duration_s: float = 0.0
    active_energy_j: float = 0.0
    active_clock_mhz: int = 0
    active_capped: bool = False

    def _active_fraction(self, now_s: float) -> float:
        if not self.active or self.active_duration_s <= 0:
            return 0.0
        return max(0.0, min(1.0, (now_s - self.active_start_s) / self.active_duration_s))

    def busy_at(self, now_s: float) -> tuple[float, float]:
        """(busy time in s, busy energy in J) accounted up to `now_s`, the running computation pro rata."""
        fraction = self._active_fraction(now_s)
        return (
            self.done_busy_s + fraction * self.active_duration_s,
            self.done_energy_j + fraction * self.active_energy_j,
        )

    def running_at(self, now_s: float) -> bool:
        """Whether a computation is running at `now_s`."""
        return self.active and self.active_start_s <= now_s < self.active_start_s + self.active_duration_s


def state_path(sim_dir: Path, uuid: str) -> Path:
    return sim_dir / f"{uuid}.state"


def busy_path(sim_dir: Path, uuid: str) -> Path:
    return sim_dir / f"{uuid}.busy"


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_gpu_files(
    sim_dir: Path,
    header: StateHeader,
    control: ControlState,
    *,
    state_mode: int = 0o644,
    busy_mode: int = 0o644,
) -> None:
    """Create (or replace) the two files of one simulated GPU, each atomically."""
    state = bytearray(STATE_SIZE)
    _HEADER.pack_into(
        state, 0, STATE_MAGIC, LAYOUT_VERSION, header.uuid.encode(), header.model.encode(), header.created_s
    )
    _CONTROL.pack_into(state, _CONTROL_OFFSET, *_control_values(control))
    busy = bytearray(BUSY_SIZE)
    busy[:8] = BUSY_MAGIC
    _write_atomically(busy_path(sim_dir, header.uuid), bytes(busy), busy_mode)
    _write_atomically(state_path(sim_dir, header.uuid), bytes(state), state_mode)


def _control_values(control: ControlState) -> tuple[object, ...]:
    return (
        control.locked_sm_clock_mhz or 0,
        control.power_limit_w,
        control.idle_folded_j,
        control.folded_at_s,
        control.folded_busy_s,
    )


def _map(path: Path, size: int, writable: bool) -> tuple[int, mmap.mmap]:
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size != size:
            raise ValueError(f"{path}: not a simulated GPU file of this layout (size)")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return fd, mmap.mmap(fd, size, access=access)
    except BaseException:
        os.close(fd)
        raise


class _SeqlockMap:
    """A mapped file with one seqlock-guarded section."""

    def __init__(self, path: Path, size: int, seq_offset: int, writable: bool) -> None:
        self.path = path
        self._fd, self._map = _map(path, size, writable)
        self._seq_offset = seq_offset

    def _seq(self) -> int:
        return int(_SEQ.unpack_from(self._map, self._seq_offset)[0])

    def _read_section(self, layout: struct.Struct, offset: int) -> tuple[Any, ...]:
        values = layout.unpack_from(self._map, offset)
        for _ in range(_READ_RETRIES):
            before = self._seq()
            if before % 2 == 0:
                values = layout.unpack_from(self._map, offset)
                if self._seq() == before:
                    return tuple(values)
            os.sched_yield()
        return tuple(values)

    def _write_section(self, layout: struct.Struct, offset: int, values: tuple[object, ...]) -> None:
        seq = self._seq()
        odd = seq if seq % 2 else (seq + 1) % 2**32
        _SEQ.pack_into(self._map, self._seq_offset, odd)
        layout.pack_into(self._map, offset, *values)
        _SEQ.pack_into(self._map, self._seq_offset, (odd + 1) % 2**32)

    @property
    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()
            os.close(self._fd)


class StateMap(_SeqlockMap):
    """`<uuid>.state`: writable by the daemon, read-only for workloads."""

    def __init__(self, path: Path, *, writable: bool) -> None:
        super().__init__(path, STATE_SIZE, _CONTROL_SEQ_OFFSET, writable)
        magic, version, uuid, model, created_s = _HEADER.unpack_from(self._map, 0)
        if magic != STATE_MAGIC or version != LAYOUT_VERSION:
            self.close()
            raise ValueError(f"{path}: not a simulated GPU state file of layout {LAYOUT_VERSION}")
        self.header = StateHeader(
            uuid=uuid.rstrip(b"\0").decode(), model=model.rstrip(b"\0").decode(), created_s=created_s
        )

    def read_control(self) -> ControlState:
        locked_mhz, power_limit_w, folded_j, folded_at_s, folded_busy_s = self._read_section(
            _CONTROL, _CONTROL_OFFSET
        )
        return ControlState(
            locked_sm_clock_mhz=int(locked_mhz) or None,
            power_limit_w=float(power_limit_w),
            idle_folded_j=float(folded_j),
            folded_at_s=float(folded_at_s),
            folded_busy_s=float(folded_busy_s),
        )

    def write_control(self, control: ControlState) -> None:
        self._write_section(_CONTROL, _CONTROL_OFFSET, _control_values(control))


class BusyMap(_SeqlockMap):
    """`<uuid>.busy`: writable by workloads, read-only for the daemon."""

    def __init__(self, path: Path, *, writable: bool) -> None:
        super().__init__(path, BUSY_SIZE, _BUSY_SEQ_OFFSET, writable)
        if bytes(self._map[:8]) != BUSY_MAGIC:
            self.close()
            raise ValueError(f"{path}: not a simulated GPU busy file")

    def read(self) -> BusyState:
        active, done_s, done_j, start_s, duration_s, energy_j, clock_mhz, capped = self._read_section(
            _BUSY, _BUSY_OFFSET
        )
        return BusyState(
            done_busy_s=float(done_s),
            done_energy_j=float(done_j),
            active=bool(active),
            active_start_s=float(start_s),
            active_duration_s=float(duration_s),
            active_energy_j=float(energy_j),
            active_clock_mhz=int(clock_mhz),
            active_capped=bool(capped),
        )

    def write(self, busy: BusyState) -> None:
        values = (
            int(busy.active),
            busy.done_busy_s,
            busy.done_energy_j,
            busy.active_start_s,
            busy.active_duration_s,
            busy.active_energy_j,
            busy.active_clock_mhz,
            int(busy.active_capped),
        )
        self._write_section(_BUSY, _BUSY_OFFSET, values)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the GPU for one computation (an exclusive `flock` on the busy file)."""
        fcntl.flock(self.fileno, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fileno, fcntl.LOCK_UN)

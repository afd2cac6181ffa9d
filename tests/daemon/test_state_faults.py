"""Fault injection for the state directory, at the system-call seam of `private_file` (`FILE_OPS`).

ENOSPC, EROFS, a device that accepts fewer bytes than asked (short writes, down to none) and a failing fsync:
the previous state.json stays whole, no acknowledged change is lost, the core keeps serving a well-behaved
client, no GPU is left locked, and the health record says persistence is failing until a write succeeds.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perseus_client.protocol import (
    AdminSetPowerLimit,
    Claim,
    ClaimOk,
    ErrorCode,
    Hello,
    ProtocolError,
    Release,
    ReleaseOk,
    SetClock,
    StatusRequest,
)

from perseusd import private_file
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.deferred import resolved
from perseusd.gpu.backend import GpuState
from perseusd.leasing import state_file
from perseusd.leasing.identity import Caller
from perseusd.leasing.restore import RETRY_FIRST_S
from perseusd.leasing.state_file import (
    SavedGpu,
    StateRecord,
    StateWriteError,
    load_state,
    save_state,
)
from perseusd.private_file import FileOps
from tests.support.daemon_core import claim, sim_core

pytestmark = pytest.mark.timeout(60)

LOCK_MHZ = 1200


def _enospc(_fd: int, _data: bytes) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _nothing_written(_fd: int, _data: bytes) -> int:
    return 0


def _half_then_nothing() -> Callable[[int, bytes], int]:
    calls = [0]

    def write(fd: int, data: bytes) -> int:
        calls[0] += 1
        return os.write(fd, data[: max(1, len(data) // 2)]) if calls[0] == 1 else 0

    return write


def _erofs_replace(_src: Path, _dst: Path) -> None:
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def _eio_fsync(_fd: int) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


FAULTS: dict[str, Callable[[], FileOps]] = {
    "enospc": lambda: FileOps(write=_enospc),
    "short-write-none": lambda: FileOps(write=_nothing_written),
    "short-write-half": lambda: FileOps(write=_half_then_nothing()),
    "erofs-rename": lambda: FileOps(replace=_erofs_replace),
    "fsync-eio": lambda: FileOps(fsync=_eio_fsync),
}


def _record(gpus: int, limit_w: float = 400.0) -> StateRecord:
    saved = {f"GPU-{i}": SavedGpu(GpuState(None, limit_w), None) for i in range(gpus)}
    return StateRecord(daemon_pid=1, daemon_start_time=2, gpus=saved)


# --------------------------------------------------------------------------------------------- state file


def test_short_writes_are_continued_until_every_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []

    def dribble(fd: int, data: bytes) -> int:
        sizes.append(min(len(data), 7))
        return os.write(fd, data[:7])

    monkeypatch.setattr(private_file, "FILE_OPS", FileOps(write=dribble))
    path = tmp_path / "state.json"
    save_state(path, _record(3))
    assert len(sizes) > 3
    assert all(size <= 7 for size in sizes)
    assert load_state(path) == _record(3)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_failed_write_keeps_the_previous_file_whole(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    save_state(path, _record(2, 300.0))
    before = path.read_bytes()
    monkeypatch.setattr(private_file, "FILE_OPS", FAULTS[fault]())
    with pytest.raises(StateWriteError, match="state file"):
        save_state(path, _record(8, 500.0))
    assert path.read_bytes() == before
    assert load_state(path) == _record(2, 300.0)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"], "temporary file left behind"


def test_corrupt_file_is_reported_not_discarded(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, _record(1))
    path.write_bytes(path.read_bytes()[:40])  # what a truncating writer would have left
    with pytest.raises(state_file.StateFileError, match=r"not valid JSON.*move it aside"):
        load_state(path)
    assert path.stat().st_size == 40  # still there for the operator


# --------------------------------------------------------------------------------------------- the core


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def core(tmp_path: Path) -> Iterator[DaemonCore]:
    with sim_core(tmp_path, gpus=4) as daemon_core:
        yield daemon_core


def _fake_clock(core: DaemonCore) -> FakeClock:
    clock = FakeClock()
    core.keeper._clock_s = clock  # the keeper's retry back-off, driven by the test
    return clock


def _read_whole(path: Path) -> dict[str, object]:
    """state.json parsed in full (a truncated file fails here) and validated by the daemon's own loader."""
    body: dict[str, object] = json.loads(path.read_bytes())
    assert load_state(path) is not None
    return body


def _error_code(fn: Callable[[], object]) -> ErrorCode:
    with pytest.raises(ProtocolError) as info:
        fn()
    return info.value.code


def _assert_serves(core: DaemonCore, caller: Caller) -> None:
    """A well-behaved client still gets answers: hello and status."""
    core.handle(caller, Hello(job="probe", client_version="t"))
    status = resolved(core.handle(caller, StatusRequest()))
    assert len(status.gpus) == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_core_under_state_dir_faults(
    fault: str,
    core: DaemonCore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other_process: subprocess.Popen[bytes],
) -> None:
    clock = _fake_clock(core)
    path = tmp_path / "state.json"
    gpu0, gpu1, gpu2, gpu3 = core.registry.uuids
    holder = Caller(0, 0, os.getpid())
    other = Caller(0, 0, other_process.pid)
    original_w = core.registry.read_all()[gpu0].power_limit_w
    core.handle(holder, Hello(job="holder", client_version="t"))
    core.handle(other, Hello(job="other", client_version="t"))
    assert isinstance(core.handle(holder, Claim(gpus=(gpu0, gpu1), job="holder")), ClaimOk)
    core.handle(holder, SetClock(gpu=gpu0, sm_clock_mhz=LOCK_MHZ))
    assert isinstance(core.handle(other, Claim(gpus=(gpu2,), job="other")), ClaimOk)
    acknowledged = _read_whole(path)

    monkeypatch.setattr(private_file, "FILE_OPS", FAULTS[fault]())
    # A change that cannot be made durable is refused, and nothing is written to the GPU.
    assert _error_code(lambda: core.handle(other, Claim(gpus=(gpu3,), job="other"))) == (
        ErrorCode.STATE_WRITE_FAILED
    )
    assert core.leases.holder(gpu3) is None
    admin_w = original_w - 50
    assert (
        _error_code(
            lambda: core.handle(
                holder, AdminSetPowerLimit(gpu=gpu3, power_limit_w=admin_w), admin_socket=True
            )
        )
        == ErrorCode.STATE_WRITE_FAILED
    )
    assert core.registry.read_all()[gpu3].power_limit_w == original_w
    assert _read_whole(path) == acknowledged  # never truncated, nothing acknowledged lost

    # A release and a client's death still restore their GPUs; the write failing only shows in status.
    reply = core.handle(holder, Release(gpus=(gpu1,)))
    assert isinstance(reply, ReleaseOk)
    assert reply.gpus == (gpu1,)
    core.client_died(holder.pid)  # the pidfd fired: must not raise
    assert core.registry.read_all()[gpu0].locked_sm_clock_mhz is None
    health = core.health()
    assert health.persistence_error is not None
    assert "retrying" in health.persistence_error
    assert core.keeper.persist_failures >= 3
    # The old file: it still holds every original (restoring one again is harmless), so nothing is lost.
    assert _read_whole(path) == acknowledged
    _assert_serves(core, other)
    assert core.leases.holder(gpu2) is not None  # the well-behaved client kept its lease

    # The state directory recovers: the next retry writes the in-memory state and status clears.
    monkeypatch.setattr(private_file, "FILE_OPS", FileOps())
    core.tick()  # before the back-off has passed: nothing yet
    assert core.health().persistence_error is not None
    clock.now_s += RETRY_FIRST_S * 64
    core.tick()
    assert core.health().persistence_error is None
    gpus = _read_whole(path)["gpus"]
    assert isinstance(gpus, dict)
    assert sorted(gpus) == [gpu2]
    assert gpus[gpu2]["lease"]["pid"] == other_process.pid
    assert isinstance(core.handle(other, Claim(gpus=(gpu3,), job="other")), ClaimOk)
    core.handle(other, Release(gpus=()))
    for reading in core.registry.read_all().values():
        assert reading.locked_sm_clock_mhz is None
        assert reading.power_limit_w == original_w
    assert not path.exists()  # nothing left to restore


def test_claim_of_a_durably_saved_gpu_still_works_while_writes_fail(
    core: DaemonCore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim needs its lease on disk: refused while writes fail, rolled back, then accepted after."""
    _fake_clock(core)
    gpu0 = core.registry.uuids[0]
    me = Caller(0, 0, os.getpid())
    core.handle(me, Hello(job="j", client_version="t"))
    monkeypatch.setattr(private_file, "FILE_OPS", FAULTS["enospc"]())
    assert _error_code(lambda: core.handle(me, Claim(gpus=(gpu0,), job="j"))) == ErrorCode.STATE_WRITE_FAILED
    assert core.leases.holder(gpu0) is None
    assert _error_code(lambda: core.handle(me, SetClock(gpu=gpu0, sm_clock_mhz=LOCK_MHZ))) in (
        ErrorCode.NOT_LEASED,
    )
    monkeypatch.setattr(private_file, "FILE_OPS", FileOps())
    assert isinstance(core.handle(me, Claim(gpus=(gpu0,), job="j")), ClaimOk)
    body = _read_whole(tmp_path / "state.json")
    gpus = body["gpus"]
    assert isinstance(gpus, dict)
    assert gpus[gpu0]["lease"]["pid"] == os.getpid()
    assert core.health().persistence_error is None


def test_status_json_and_text_show_persistence_failing(
    core: DaemonCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perseusd.ctl.status_cmd import render_table, status_json

    _fake_clock(core)
    me = Caller(0, 0, os.getpid())
    gpu0, gpu1 = core.registry.uuids[:2]
    claim(core, me, (gpu0, gpu1), "j")
    monkeypatch.setattr(private_file, "FILE_OPS", FAULTS["enospc"]())
    core.handle(me, Release(gpus=(gpu0,)))
    reply = resolved(core.handle(me, StatusRequest()))
    data = status_json(reply)  # type: ignore[arg-type]
    assert "No space left on device" in data["daemon"]["persistence_error"]
    assert "PERSISTENCE FAILING" in render_table(reply)  # type: ignore[arg-type]
    healthy = dataclasses.replace(reply.daemon, persistence_error=None)  # type: ignore[attr-defined]
    assert "PERSISTENCE" not in render_table(dataclasses.replace(reply, daemon=healthy))  # type: ignore[type-var]

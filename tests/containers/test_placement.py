"""Where a caller runs, read from a /proc tree, and which GPUs that lets it claim (no namespaces needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perseusd.errors import NotPermittedError
from perseusd.gpu.backend import GpuInfo
from perseusd.leasing.gpu_access import GpuAccess
from perseusd.leasing.identity import Caller
from perseusd.leasing.placement import Placement, parse_device_rules, read_placement

PID = 4242


def _info(index: int, minor: int | None = None) -> GpuInfo:
    return GpuInfo(f"GPU-{index}", index, "sim", f"0:{index}", (1410,), 100.0, 400.0, 400.0, True, minor)


def _place(
    *,
    containerized: bool | None = True,
    minors: frozenset[int] | None = None,
    rules: str | None = None,
    offset_ns: int = 0,
) -> Placement:
    return Placement(
        PID,
        containerized,
        1,
        "/c",
        minors,
        None if rules is None else parse_device_rules(rules),
        offset_ns,
        {},
    )


def _proc_tree(tmp_path: Path, *, cgroup: str, same_mount_ns: bool) -> Path:
    proc = tmp_path / "proc"
    base = proc / str(PID)
    (base / "ns").mkdir(parents=True)
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "mnt").write_text("ours")
    mnt = base / "ns" / "mnt"
    if same_mount_ns:
        os.link(proc / "self" / "ns" / "mnt", mnt)
    else:
        mnt.write_text("theirs")
    (base / "status").write_text("Name:\tpython\nNSpid:\t4242\t7\n")
    (base / "cgroup").write_text(f"5:devices:{cgroup}\n0::{cgroup}\n")
    (base / "timens_offsets").write_text("monotonic           0         0\nboottime            0         0\n")
    (base / "environ").write_bytes(b"PATH=/bin\0CUDA_VISIBLE_DEVICES=1\0SLURM_JOB_ID=42\0")
    return proc


def test_device_rules_parse_and_decide() -> None:
    rules = parse_device_rules("c 1:3 rwm\nc 195:2 rw\nc 195:* m\nb *:* m\ngarbage\nc x:1 rw\n")
    assert len(rules) == 4
    assert [any(r.allows_gpu(m) for r in rules) for m in (0, 1, 2)] == [False, False, True]
    assert parse_device_rules("a *:* rwm")[0].allows_gpu(7)


@pytest.mark.skipif(os.geteuid() != 0, reason="device nodes need root (mknod)")
def test_a_containers_device_nodes_cgroup_and_environment_are_read(tmp_path: Path) -> None:
    proc = _proc_tree(tmp_path, cgroup="/libpod_parent/libpod-1", same_mount_ns=False)
    dev = proc / str(PID) / "root" / "dev"
    dev.mkdir(parents=True)
    os.mknod(dev / "nvidia0", 0o600 | 0o020000, os.makedev(195, 2))  # renamed: host GPU 2
    os.mknod(dev / "nvidiactl", 0o600 | 0o020000, os.makedev(195, 255))
    os.mknod(dev / "nvidia9", 0o600 | 0o020000, os.makedev(1, 3))  # not a GPU node
    (dev / "nvidia5").write_text("a regular file")
    devices = tmp_path / "devices"
    (devices / "libpod_parent" / "libpod-1").mkdir(parents=True)
    (devices / "libpod_parent" / "libpod-1" / "devices.list").write_text("c 195:2 rw\nc 1:3 rwm\n")
    place = read_placement(PID, proc=proc, devices_root=devices)
    assert place.containerized is True
    assert place.ns_pid == 7
    assert place.cgroup == "/libpod_parent/libpod-1"
    assert place.device_minors == frozenset({2})
    assert place.environment == {"CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_ID": "42"}
    assert place.monotonic_offset_ns == 0
    assert [place.gpu_allowed(m) for m in (0, 2)] == [False, True]


def test_a_host_process_is_restricted_by_its_cgroup_only(tmp_path: Path) -> None:
    proc = _proc_tree(tmp_path, cgroup="/slurm/uid_0/job_42/step_0", same_mount_ns=True)
    devices = tmp_path / "devices" / "slurm" / "uid_0" / "job_42" / "step_0"
    devices.mkdir(parents=True)
    (devices / "devices.list").write_text("c 195:1 rwm\n")
    place = read_placement(PID, proc=proc, devices_root=tmp_path / "devices")
    assert place.containerized is False
    assert place.device_minors is None
    assert [place.gpu_allowed(m) for m in (0, 1)] == [False, None]
    access = GpuAccess("auto", [_info(0), _info(1)], read=lambda _pid: place)
    assert access.visible(access.placement(Caller(0, 0, PID))) == ("GPU-1",)


def test_unreadable_parts_are_unknown_not_guessed(tmp_path: Path) -> None:
    place = read_placement(PID, proc=tmp_path / "nothing", devices_root=tmp_path / "none")
    assert place == Placement(PID, None, None, None, None, None, 0, None)
    assert place.gpu_allowed(0) is None


def test_access_follows_the_containers_devices_in_host_order() -> None:
    infos = [_info(i, minor=m) for i, m in enumerate((3, 2, 1, 0))]  # minors in reverse of the indices
    access = GpuAccess("auto", infos)
    assert access.visible(_place(minors=frozenset({0, 2}))) == ("GPU-1", "GPU-3")
    assert access.visible(_place(containerized=False)) is None
    assert access.visible(_place(minors=frozenset())) == ()
    assert access.visible(_place(minors=frozenset({0, 2}), rules="c 195:0 rw")) == ("GPU-3",)
    caller = Caller(100_000, 65_534, PID)
    access.check_claim(caller, _place(minors=frozenset({2})), ["GPU-1"])
    with pytest.raises(NotPermittedError, match="not among the GPUs given"):
        access.check_claim(caller, _place(minors=frozenset({2})), ["GPU-1", "GPU-0"])
    assert access.refused == 1


def test_strict_refuses_a_container_it_cannot_read_and_off_checks_nothing() -> None:
    infos = [_info(0), _info(1)]
    unreadable = _place(containerized=True, minors=None)
    assert GpuAccess("auto", infos).visible(unreadable) is None
    strict = GpuAccess("strict", infos, read=lambda _pid: unreadable)
    assert strict.visible(unreadable) == ()
    with pytest.raises(NotPermittedError, match="CAP_SYS_PTRACE"):
        strict.check_claim(Caller(1, 1, PID), unreadable, ["GPU-0"])
    assert strict.visible(_place(containerized=False)) is None
    off = GpuAccess("off", infos, read=lambda _pid: unreadable)
    assert off.visible(off.placement(Caller(1, 1, PID))) is None
    assert off.visible(_place(minors=frozenset())) is None


def test_a_shifted_clock_is_refused() -> None:
    access = GpuAccess("auto", [_info(0)], read=lambda _pid: _place(offset_ns=-5_000_000_000))
    with pytest.raises(NotPermittedError, match="time namespace"):
        access.placement(Caller(1, 1, PID))

"""The uniform pool target's originals file: written before a grant's first limit, removed once the limits are
back, restored at start-up after a crash; a grant whose originals cannot be saved is not applied."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from perseusd.gpu.backend import GpuInfo, GpuState
from perseusd.gpu.reading import GpuReading
from perseusd.pool.limits_file import (
    PoolLimitsFileError,
    load_originals,
    pool_limits_path,
    restore_pool_limits,
    save_originals,
)
from perseusd.pool.uniform import UniformPowerTarget


class Gpus:
    """Two GPUs' power limits (100-400 W), as the daemon's registry holds them."""

    def __init__(self) -> None:
        self.limits_w = {"gpu-0": 400.0, "gpu-1": 300.0}
        self.writes: list[tuple[str, float]] = []

    def infos(self) -> tuple[GpuInfo, ...]:
        return tuple(
            GpuInfo(u, i, "sim", f"0000:0{i}:00.0", (1410,), 100.0, 400.0, 400.0, True)
            for i, u in enumerate(self.limits_w)
        )

    def set_power_limit_w(self, uuid: str, limit_w: float) -> float:
        self.writes.append((uuid, limit_w))
        self.limits_w[uuid] = limit_w
        return limit_w

    def save_state(self, uuid: str) -> GpuState:
        return GpuState(locked_sm_clock_mhz=None, power_limit_w=self.limits_w[uuid])

    def read_all(self) -> dict[str, GpuReading]:
        return {}


def test_originals_saved_before_the_grant_and_removed_once_back(tmp_path: Path) -> None:
    gpus = Gpus()
    path = pool_limits_path(tmp_path)
    target = UniformPowerTarget(gpus, originals_path=path)
    assert not path.exists()
    target.apply_grant_w(300)
    assert load_originals(path) == {"gpu-0": 400.0, "gpu-1": 300.0}
    assert gpus.limits_w == {"gpu-0": pytest.approx(150), "gpu-1": pytest.approx(150)}
    assert path.stat().st_mode & 0o777 == 0o600
    target.apply_grant_w(None)
    assert gpus.limits_w == {"gpu-0": 400.0, "gpu-1": 300.0}
    assert not path.exists()


def test_a_crash_leaves_the_file_and_the_next_start_restores_it(tmp_path: Path) -> None:
    gpus = Gpus()
    UniformPowerTarget(gpus, originals_path=pool_limits_path(tmp_path)).apply_grant_w(500)
    assert sum(gpus.limits_w.values()) == pytest.approx(500)  # then the daemon dies
    restored = restore_pool_limits(gpus, {"gpu-0", "gpu-1"}, tmp_path)
    assert restored == ["gpu-0", "gpu-1"]
    assert gpus.limits_w == {"gpu-0": 400.0, "gpu-1": 300.0}
    assert not pool_limits_path(tmp_path).exists()
    assert restore_pool_limits(gpus, {"gpu-0", "gpu-1"}, tmp_path) == []  # nothing left


def test_unsaveable_originals_mean_no_grant(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gpus = Gpus()
    target = UniformPowerTarget(gpus, originals_path=tmp_path / "missing-dir" / "pool-limits.json")
    with caplog.at_level(logging.ERROR):
        target.apply_grant_w(300)
    assert gpus.writes == []
    assert "the grant is not applied" in caplog.text


def test_a_foreign_file_is_refused_and_left_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = pool_limits_path(tmp_path)
    path.write_text('{"version": 1, "power_limits_w": {"gpu-0": -5}}')
    with pytest.raises(PoolLimitsFileError):
        load_originals(path)
    gpus = Gpus()
    with caplog.at_level(logging.ERROR):
        assert restore_pool_limits(gpus, {"gpu-0"}, tmp_path) == []
    assert gpus.writes == []
    assert path.exists()
    assert "not restored" in caplog.text


def test_a_gpu_no_longer_on_the_node_is_skipped(tmp_path: Path) -> None:
    save_originals(pool_limits_path(tmp_path), {"gpu-0": 350.0, "gone": 200.0})
    gpus = Gpus()
    assert restore_pool_limits(gpus, {"gpu-0", "gpu-1"}, tmp_path) == ["gpu-0"]
    assert gpus.limits_w["gpu-0"] == 350.0

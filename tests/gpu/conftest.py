"""Fixtures of the GPU tests: a fake clock, a scripted fake `pynvml`, backends of both kinds."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.gpu.backend import GpuBackend
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.sim import SimBackend

from .fake_pynvml import FakeGpu, FakeNvml


class FakeClock:
    """A clock that only moves when told to (or when `sleep` is called)."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s
        self.sleeps_s: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, duration_s: float) -> None:
        self.sleeps_s.append(duration_s)
        self.now_s += duration_s

    def advance(self, duration_s: float) -> None:
        self.now_s += duration_s


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Two fake A100s installed as the `pynvml` module."""
    fake = FakeNvml([FakeGpu(uuid="GPU-11111111-0000-0000-0000-000000000000"), FakeGpu(uuid="GPU-2222")])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


@pytest.fixture
def sim_backend(tmp_path: Path, fake_clock: FakeClock) -> Iterator[SimBackend]:
    backend = SimBackend(tmp_path / "sim", gpus=2, noise=0.0, clock=fake_clock, sleep=fake_clock.sleep)
    yield backend
    backend.close()


@pytest.fixture(params=["sim", "nvml"])
def any_backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GpuBackend]:
    """The contract suite's backend: simulated, or NVML over the fake `pynvml`."""
    backend: GpuBackend
    if request.param == "sim":
        clock = FakeClock()
        backend = SimBackend(tmp_path / "sim", gpus=2, noise=0.0, clock=clock, sleep=clock.sleep)
    else:
        fake = FakeNvml([FakeGpu(uuid="GPU-aaaa"), FakeGpu(uuid="GPU-bbbb")])
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        backend = NvmlBackend()
    yield backend
    backend.close()

"""Backend selection and the measurement helpers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from perseusd.gpu.errors import GpuInvalidArgumentError, NvmlLibraryError
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.probe import clock_switch_latency, energy_counter_period
from perseusd.gpu.select import open_backend
from perseusd.gpu.sim import SimBackend

from .conftest import FakeClock
from .fake_pynvml import FakeNvml

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_sim_uuids_are_stable_and_uuid_like(tmp_path: Path) -> None:
    first = open_backend("sim", sim_gpus=3, sim_model="a40", sim_dir=tmp_path / "a", environ={})
    second = open_backend("sim", sim_gpus=3, sim_model="a40", sim_dir=tmp_path / "b", environ={})
    a100 = open_backend("sim", sim_gpus=1, sim_dir=tmp_path / "c", environ={})
    uuids = [d.info.uuid for d in first.devices()]
    assert isinstance(first, SimBackend)
    assert uuids == [d.info.uuid for d in second.devices()]
    assert len(set(uuids)) == 3
    assert all(UUID_RE.match(uuid) for uuid in uuids)
    assert a100.devices()[0].info.uuid not in uuids
    assert first.devices()[0].info.power_limit_max_w == 300.0
    for backend in (first, second, a100):
        backend.close()


def test_auto_without_nvml_says_use_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlLibraryError, match="use --backend sim"):
        open_backend("auto")


def test_auto_and_nvml_pick_nvml_when_it_initialises(fake_nvml: FakeNvml) -> None:
    assert isinstance(open_backend("auto"), NvmlBackend)
    assert fake_nvml.calls_to("nvmlInit") == [()]
    assert isinstance(open_backend("nvml"), NvmlBackend)


def test_unknown_kind() -> None:
    with pytest.raises(GpuInvalidArgumentError, match="auto, nvml, sim"):
        open_backend("cuda")


def test_probe_measures_the_sim_counter_period_and_switch(tmp_path: Path) -> None:
    clock = FakeClock()
    backend = SimBackend(tmp_path, noise=0.0, update_period_s=0.1, clock=clock, sleep=clock.sleep)
    device = backend.devices()[0]
    period = energy_counter_period(device, duration_s=1.0, poll_s=0.01, clock=clock, sleep=clock.sleep)
    assert period.changes >= 9
    assert period.median_period_s == pytest.approx(0.1)
    switch = clock_switch_latency(device, 1001, clock=clock)
    assert (switch.applied_mhz, switch.final_mhz, switch.latency_s) == (1005, 1005, 0.0)
    backend.close()


def test_every_registered_backend_says_whether_its_counters_are_simulated() -> None:
    from perseusd.gpu.select import BACKEND_KINDS, simulated_counters

    assert BACKEND_KINDS == ("auto", "nvml", "sim", "mixed")
    assert [simulated_counters(kind) for kind in BACKEND_KINDS] == [False, False, True, False]
    assert simulated_counters("mixed", mixed_real="sim")
    assert not simulated_counters("cuda")

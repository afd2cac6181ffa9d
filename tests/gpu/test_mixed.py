"""The mixed backend: real GPUs (NVML over the fake `pynvml`, or a simulated stand-in), then boards."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseusd.gpu.errors import GpuInvalidArgumentError, GpuNotSupportedError, NvmlLibraryError
from perseusd.gpu.mixed import MixedBackend
from perseusd.gpu.nvml import NvmlDevice
from perseusd.gpu.select import open_backend
from perseusd.gpu.sim import SimDevice, sim_uuid
from perseusd.gpu.sim_shared import state_path
from perseusd.workload.sim_workload import list_sim_gpus

from .fake_pynvml import FakeNvml


def test_nvml_gpus_first_then_boards_numbered_after_them(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    backend = open_backend("mixed", sim_gpus=3, sim_model="h100_sxm", sim_dir=tmp_path, environ={})
    try:
        assert isinstance(backend, MixedBackend)
        devices = backend.devices()
        assert backend.real_count == 2
        assert [type(d) for d in devices] == [NvmlDevice, NvmlDevice, SimDevice, SimDevice, SimDevice]
        assert [d.info.index for d in devices] == [0, 1, 2, 3, 4]
        assert [d.info.uuid for d in devices[2:]] == [sim_uuid("h100_sxm", i) for i in (2, 3, 4)]
        assert list_sim_gpus(tmp_path) == sorted(d.info.uuid for d in devices[2:])
    finally:
        backend.close()
    assert fake_nvml.calls_to("nvmlShutdown") == [()]


def test_a_simulated_board_stands_in_for_the_real_gpu(tmp_path: Path) -> None:
    backend = open_backend(
        "mixed", sim_gpus=3, sim_model="h100_sxm", sim_dir=tmp_path, environ={}, mixed_real="sim"
    )
    try:
        devices = backend.devices()
        assert [d.info.index for d in devices] == [0, 1, 2, 3]
        assert [d.info.uuid for d in devices] == [sim_uuid("h100_sxm", i) for i in range(4)]
        assert all(state_path(tmp_path, d.info.uuid).exists() for d in devices)
        assert devices[0].set_locked_sm_clock_mhz(1500) == 1500
        assert devices[1].locked_sm_clock_mhz() is None  # each GPU its own state
    finally:
        backend.close()


def test_faults_name_gpus_by_their_index_in_the_mixed_order(tmp_path: Path) -> None:
    faults = '[{"gpu": 2, "op": "energy_mj", "kind": "error", "error": "not_supported"}]'
    backend = open_backend(
        "mixed",
        sim_gpus=2,
        sim_model="h100_sxm",
        sim_dir=tmp_path,
        environ={"PERSEUSD_SIM_FAULTS": faults},
        mixed_real="sim",
    )
    try:
        stand_in, first, second = backend.devices()
        stand_in.energy_mj()
        first.energy_mj()
        with pytest.raises(GpuNotSupportedError):
            second.energy_mj()
    finally:
        backend.close()


def test_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GpuInvalidArgumentError, match="choose one of nvml, sim"):
        open_backend("mixed", sim_dir=tmp_path, mixed_real="cuda")
    with pytest.raises(GpuInvalidArgumentError, match="sim directory"):
        open_backend("mixed", mixed_real="sim")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    with pytest.raises(NvmlLibraryError):
        open_backend("mixed", sim_dir=tmp_path)
    assert not list_sim_gpus(tmp_path)  # nothing created when the real part cannot open

"""The mixed backend: real GPUs and simulated boards under one daemon (`perseusd --backend mixed`).

A machine with one GPU cannot hold a pipeline, but it can hold one stage of it: the daemon drives the real
GPU(s) through NVML and `sim_gpus` simulated boards beside them (`perseusd.gpu.sim`), leases and plans them
as usual. The real GPUs come first (indices 0..R-1, their NVML order); the simulated boards follow (indices
R..R+N-1, their files in the sim directory as with `--backend sim`), so a workload finds the real GPU at
index 0 and the boards by their shared files.

Without a GPU (tests, CI), a simulated board stands in for the real one (`stand_in=True`): it is numbered
and placed like the real GPU, and is a board in the sim directory like the others.
"""

from __future__ import annotations

from perseusd.gpu.backend import GpuBackend, GpuDevice


class MixedBackend(GpuBackend):
    """`real`'s GPUs, then `simulated`'s; closing closes both (the simulated first)."""

    def __init__(self, real: GpuBackend, simulated: GpuBackend) -> None:
        self._real = real
        self._simulated = simulated
        self._devices = [*real.devices(), *simulated.devices()]
        indices = [device.info.index for device in self._devices]
        if len(set(indices)) != len(indices):
            raise ValueError(f"the real and simulated GPUs share indices: {indices}")
        uuids = [device.info.uuid for device in self._devices]
        if len(set(uuids)) != len(uuids):
            raise ValueError("the real and simulated GPUs share a UUID")

    @property
    def real_count(self) -> int:
        """How many of the devices (the first ones) are the real GPUs (or their stand-ins)."""
        return len(self._real.devices())

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def close(self) -> None:
        try:
            self._simulated.close()
        finally:
            self._real.close()

"""Which GPUs a caller may claim: those its container holds and its cgroup lets it open.

The daemon knows a caller by its host pid (SO_PEERCRED) and reads where it runs (`placement`). A process in
a container (another mount namespace) may claim the GPUs whose device nodes its `/dev` holds; a process whose
cgroup v1 devices controller forbids a GPU's node (Slurm's ConstrainDevices, a container runtime's rules) may
not claim that GPU. The GPUs it may claim, in the order the host enumerates them (NVML's, the PCI order, as
CUDA does inside the container), are the GPUs its device indices (`CUDA_VISIBLE_DEVICES=0`) name.

Modes: "auto" enforces what the daemon can read and lets the rest through; "strict" refuses a container whose
device list it cannot read; "off" checks nothing (every caller sees every GPU, as before containers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from perseusd.errors import NotPermittedError
from perseusd.gpu.backend import GpuInfo, gpu_minor
from perseusd.leasing.identity import Caller
from perseusd.leasing.placement import Placement, read_placement

logger = logging.getLogger(__name__)

ACCESS_MODES = ("auto", "strict", "off")


class GpuAccess:
    """The GPU access decisions of one daemon (its GPUs and mode)."""

    def __init__(
        self,
        mode: str,
        infos: Sequence[GpuInfo],
        read: Callable[[int], Placement] = read_placement,
    ) -> None:
        if mode not in ACCESS_MODES:
            raise ValueError(f"gpu access mode must be one of {', '.join(ACCESS_MODES)}")
        self.mode = mode
        self._infos = sorted(infos, key=lambda info: info.index)
        self._read = read
        self.refused = 0
        """Claims refused because the caller's container or cgroup does not hold the GPU."""

    def placement(self, caller: Caller) -> Placement | None:
        """Where the caller runs (read in every mode: its Slurm job is read from it too); raises for a
        process the daemon cannot serve truthfully (a time namespace that shifts its event timestamps)."""
        placement = self._read(caller.pid)
        if placement.monotonic_offset_ns:
            raise NotPermittedError(
                f"process {caller.pid} runs in a time namespace whose monotonic clock is shifted by "
                f"{placement.monotonic_offset_ns / 1e9:.3f} s: its event timestamps would be wrong; "
                "run it without a time namespace offset",
            )
        return placement

    def visible(self, placement: Placement | None) -> tuple[str, ...] | None:
        """The UUIDs the caller may claim, in its own device order; None: every GPU (nothing restricts it
        that the daemon can see)."""
        if placement is None or self.mode == "off":
            return None
        verdicts = [(info.uuid, placement.gpu_allowed(gpu_minor(info))) for info in self._infos]
        if all(verdict is None for _, verdict in verdicts):
            return () if self._unknown_container(placement) else None
        return tuple(uuid for uuid, verdict in verdicts if verdict is not False)

    def check_claim(self, caller: Caller, placement: Placement | None, gpus: Sequence[str]) -> None:
        """Raise `NotPermittedError` unless the caller's container and cgroup hold every GPU of `gpus`."""
        visible = self.visible(placement)
        if visible is None:
            return
        for gpu in gpus:
            if gpu not in visible:
                self.refused += 1
                raise NotPermittedError(self._why(caller, placement, gpu))

    def _unknown_container(self, placement: Placement) -> bool:
        """In strict mode, a container (or a process whose namespace is unknown) whose devices are unread."""
        return self.mode == "strict" and placement.containerized is not False

    def _why(self, caller: Caller, placement: Placement | None, gpu: str) -> str:
        if placement is not None and self._unknown_container(placement) and placement.device_minors is None:
            return (
                f"GPU {gpu}: cannot read which GPUs the container of process {caller.pid} holds "
                "(gpu_access = strict; the daemon needs CAP_SYS_PTRACE to read /proc/<pid>/root)"
            )
        return (
            f"GPU {gpu} is not among the GPUs given to process {caller.pid} "
            "(its container's /dev/nvidia* device nodes and its cgroup's device rules)"
        )

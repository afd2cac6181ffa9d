"""Whether the limits the power cap wrote are still the GPUs' limits.

The cap writes a limit only when it changes (`LimitWriter._write_batch`), so a limit something outside the
daemon wrote (`nvidia-smi -pl`, another management agent) would stand until the allocation moved. Once per
recompute the cap reads its GPUs without waiting (`submit`); a later tick takes the finished readings
(`overwritten`) and names each GPU whose limit is no longer the one the cap wrote then, so that the cap
writes it again. A reading that failed or is not done yet says nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future

from perseusd.errors import GpuError
from perseusd.gpu.reading import GpuReading
from perseusd.gpu.registry import GpuRegistry

logger = logging.getLogger(__name__)

TOLERANCE_W = 0.5
"""NVML takes a limit in mW and a GPU may round it: a difference this small is the same limit."""


class LimitCheck:
    """Readings in flight, each with the limit the cap had written when it was asked for (see the module)."""

    def __init__(self, registry: GpuRegistry) -> None:
        self._registry = registry
        self._reads: dict[str, tuple[Future[GpuReading], float, float]] = {}

    def submit(self, limits_w: Mapping[str, float], enforced_w: Mapping[str, float]) -> None:
        """Read every GPU with a written limit (requested, and as the GPU enforced it) that is not being read
        already (never waits)."""
        for uuid, limit_w in limits_w.items():
            if uuid in self._reads or uuid not in enforced_w:
                continue
            try:
                self._reads[uuid] = (self._registry.submit_read(uuid), limit_w, enforced_w[uuid])
            except GpuError:
                continue

    def overwritten(self, limits_w: Mapping[str, float]) -> list[str]:
        """The GPUs whose finished reading shows a limit other than the one the cap wrote and still holds."""
        found: list[str] = []
        for uuid, (future, limit_w, expected_w) in list(self._reads.items()):
            if not future.done():
                continue
            del self._reads[uuid]
            if future.exception() is not None or limits_w.get(uuid) != limit_w:
                continue  # no reading, or the cap wrote another limit since: the next check judges that
            read_w = future.result().power_limit_w
            if read_w is not None and abs(read_w - expected_w) > TOLERANCE_W:
                logger.warning(
                    "power cap: GPU %s's power limit is %.1f W, not the %.1f W the cap wrote (written by "
                    "something else): writing it again",
                    uuid,
                    read_w,
                    expected_w,
                )
                found.append(uuid)
        return found

"""The power limits the node cap writes, and giving them back when the cap is lifted.

`NodeCap` hands each allocation's limits to `LimitWriter.write`: lower ones first (all GPUs at once), then
raised ones, so that the limits' sum never passes the higher of the old and new sums; a limit that did not
change is not written again, and after each write the GPUs are read (without waiting) to find a limit
something else wrote over (`perseusd.cap.limit_check`). A limit is written only after the GPU's original
state is durably saved (the restore machinery), so cap clear, daemon stop and start-up after a crash restore
it like a clock. Everything runs on the daemon's main loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from perseusd.cap.limit_check import LimitCheck
from perseusd.errors import GpuError
from perseusd.gpu.registry import GpuRegistry
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.restore import RestoreKeeper
from perseusd.leasing.state_file import StateWriteError

logger = logging.getLogger(__name__)


class LimitWriter:
    """The limits the cap wrote and still holds (see the module)."""

    def __init__(self, registry: GpuRegistry, keeper: RestoreKeeper, leases: LeaseBook) -> None:
        self._registry = registry
        self._keeper = keeper
        self._leases = leases
        self.limits_w: dict[str, float] = {}
        self._enforced_w: dict[str, float] = {}
        """What each GPU enforced of the limit the cap wrote (W)."""
        self._check = LimitCheck(registry)
        self.write_error = ""

    def write(self, limits_w: dict[str, float]) -> None:
        """Lower limits first (all GPUs at once), then raised ones: the sum never passes the higher of the
        old and new sums. A GPU is written only once its original is durably saved. Then the GPUs with a
        written limit are read, to find one something else writes over (`overwritten`)."""
        lower = [u for u in limits_w if limits_w[u] < self.limits_w.get(u, float("inf"))]
        errors = self._write_batch(lower, limits_w)
        errors += self._write_batch([u for u in limits_w if u not in lower], limits_w)
        if errors and "; ".join(errors) != self.write_error:
            logger.error("power cap: cannot write power limits: %s", "; ".join(errors))
        self.write_error = "; ".join(errors)
        self._check.submit(self.limits_w, self._enforced_w)

    def _write_batch(self, uuids: list[str], limits_w: dict[str, float]) -> list[str]:
        """Write these GPUs' limits in parallel and wait for them. A limit the cap wrote and nothing wrote
        over since (`forget`, `LimitCheck`) is not written again: the main loop then waits for no owner
        thread, which may be inside a clock set (~10 ms on an H100), at every recompute."""
        errors: list[str] = []
        futures = {}
        for uuid in uuids:
            if self.limits_w.get(uuid) == limits_w[uuid]:
                continue
            try:
                self._keeper.ensure_saved(uuid)
                futures[uuid] = self._registry.submit_power_limit_w(uuid, limits_w[uuid])
            except (StateWriteError, GpuError) as exc:
                errors.append(f"{uuid}: {exc}")
        for uuid, future in futures.items():
            try:
                self._enforced_w[uuid] = self._registry.wait(uuid, future)
            except GpuError as exc:
                errors.append(f"{uuid}: {exc}")
                self.limits_w.pop(uuid, None)
                continue
            self.limits_w[uuid] = limits_w[uuid]
        return errors

    def overwritten(self) -> list[str]:
        """The GPUs whose limit, read since the last write, is no longer the one the cap wrote."""
        return self._check.overwritten(self.limits_w)

    def forget(self, gpus: Iterable[str]) -> None:
        """These GPUs' limits were written outside the cap: the next `write` writes them again."""
        for uuid in gpus:
            self.limits_w.pop(uuid, None)

    def restore(self) -> None:
        """Every limit the cap wrote goes back to the GPU's original."""
        for uuid in sorted(self.limits_w):
            self._restore_limit(uuid)
        self.limits_w.clear()

    def _restore_limit(self, uuid: str) -> None:
        saved = self._keeper.saved(uuid)
        if saved is None:
            return
        if self._leases.holder(uuid) is None:
            self._keeper.restore([uuid])  # nothing else wrote it: restore and forget the original
            return
        try:  # a job holds it: its clock stays, its limit goes back, its release restores the rest
            self._registry.set_power_limit_w(uuid, saved.original.power_limit_w)
        except GpuError as exc:
            logger.error("power cap: restoring the power limit of %s failed: %s", uuid, exc)

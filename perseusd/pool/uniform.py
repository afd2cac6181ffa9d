"""`UniformPowerTarget`: a node's grant as one power limit for all its GPUs (nodes without a smarter cap).

The per-GPU limit is one level for every GPU, clamped to each GPU's power-limit constraints, chosen so the
node's limits sum to the grant (a GPU at its maximum leaves the rest to the others). A grant below the sum
of the minimum limits cannot be met: every GPU is held at its minimum and the shortfall is logged, never
applied as an impossible limit. Demand is the sum of the maximum limits, the floor the sum of the minimum
ones, all of it in priority tier 0. No grant (None) puts back the limits the GPUs had when this target was
built. Measured power is the energy counters' average between two readings. Safe to call from any thread
(one lock; the GPUs' owner threads make the calls).

With a state directory, those originals are durably saved (`pool_limits_file`) before the first limit of a
grant is written, and the file removed once they are back: a daemon that crashes under a grant has its
GPUs' limits put back when it starts again. A grant whose originals cannot be saved is not applied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from perseusd.gpu.backend import GpuInfo, GpuState
from perseusd.gpu.reading import GpuReading
from perseusd.pool.limits_file import PoolLimitsFileError, remove_originals, save_originals

logger = logging.getLogger(__name__)

BISECTION_STEPS = 60
HOLD_TOLERANCE_W = 1.0
"""A limit within this of the wanted one is left alone (drivers round limits to their own steps)."""


class GpuLimits(Protocol):
    """What this target needs of the daemon's `GpuRegistry`."""

    def infos(self) -> tuple[GpuInfo, ...]: ...
    def set_power_limit_w(self, uuid: str, limit_w: float) -> float: ...
    def save_state(self, uuid: str) -> GpuState: ...
    def read_all(self) -> dict[str, GpuReading]: ...


def uniform_limits_w(grant_w: float, gpus: Sequence[GpuInfo]) -> dict[str, float]:
    """One level for all GPUs, clamped to each one's [min, max] limits, summing to `grant_w` where it can
    (to the minimums below their sum, to the maximums above theirs)."""

    def total_w(level_w: float) -> float:
        return sum(min(max(level_w, g.power_limit_min_w), g.power_limit_max_w) for g in gpus)

    low_w, high_w = 0.0, max((g.power_limit_max_w for g in gpus), default=0.0)
    for _ in range(BISECTION_STEPS):
        middle_w = (low_w + high_w) / 2
        if total_w(middle_w) <= grant_w:
            low_w = middle_w
        else:
            high_w = middle_w
    return {g.uuid: min(max(low_w, g.power_limit_min_w), g.power_limit_max_w) for g in gpus}


class UniformPowerTarget:
    """A `NodePowerTarget` through uniform per-GPU power limits (see module)."""

    def __init__(
        self, gpus: GpuLimits, clock: Callable[[], float] = time.monotonic, originals_path: Path | None = None
    ) -> None:
        self._gpus, self._clock = gpus, clock
        self._originals_path = originals_path
        self._originals_saved = False
        self._last_energy: tuple[float, int] | None = None
        self._infos = gpus.infos()
        self._originals_w = {g.uuid: gpus.save_state(g.uuid).power_limit_w for g in self._infos}
        self._lock = threading.Lock()
        self._granted = False
        self.limits_w: Mapping[str, float] = dict(self._originals_w)
        """The limits requested last (W)."""

    def power_demand_w(self) -> float:
        return sum(g.power_limit_max_w for g in self._infos)

    def power_floor_w(self) -> float:
        return sum(g.power_limit_min_w for g in self._infos)

    def priority_demand_w(self) -> dict[int, float]:
        return {0: self.power_demand_w() - self.power_floor_w()}

    def apply_grant_w(self, grant_w: float | None) -> None:
        with self._lock:
            if grant_w is None:
                limits_w = dict(self._originals_w)
            else:
                limits_w = uniform_limits_w(grant_w, self._infos)
                if grant_w < self.power_floor_w():
                    logger.error(
                        "power grant %.1f W is below this node's minimum power limits (%.1f W in all): "
                        "every GPU is held at its minimum",
                        grant_w,
                        self.power_floor_w(),
                    )
            if grant_w is not None and not self._save_originals():
                return
            failed = False
            for uuid, limit_w in limits_w.items():
                try:
                    self._gpus.set_power_limit_w(uuid, limit_w)
                except Exception as exc:  # one GPU failing never stops the others
                    failed = True
                    logger.error("power limit %.1f W on GPU %s failed: %s", limit_w, uuid, exc)
            self.limits_w = limits_w
            self._granted = grant_w is not None
            if grant_w is None and not failed and self._originals_saved and self._originals_path is not None:
                remove_originals(self._originals_path)  # every limit is back: nothing to restore
                self._originals_saved = False

    def _save_originals(self) -> bool:
        """Whether the originals are durably saved (or need not be: no state directory)."""
        if self._originals_path is None or self._originals_saved:
            return True
        try:
            save_originals(self._originals_path, self._originals_w)
        except PoolLimitsFileError as exc:
            logger.error("power pool: %s: the grant is not applied (its limits could not be restored)", exc)
            return False
        self._originals_saved = True
        return True

    def measure_and_hold_w(self) -> float | None:
        """The node's GPUs' power now (W; None when a GPU cannot say), and every limit something else moved
        (a restore after a client released its GPU puts back the limit saved at its claim) set again."""
        readings = self._gpus.read_all()
        with self._lock:
            held = self.limits_w if self._granted else {}  # uncapped: an admin's own limits are left alone
            for uuid, limit_w in held.items():
                held_w = readings[uuid].power_limit_w if uuid in readings else None
                if held_w is not None and abs(held_w - limit_w) > HOLD_TOLERANCE_W:
                    logger.warning(
                        "GPU %s power limit %.1f W moved from %.1f W: set again", uuid, held_w, limit_w
                    )
                    try:
                        self._gpus.set_power_limit_w(uuid, limit_w)
                    except Exception as exc:
                        logger.error("power limit %.1f W on GPU %s failed: %s", limit_w, uuid, exc)
        return self._average_w(readings, self._clock())

    def _average_w(self, readings: Mapping[str, GpuReading], now_s: float) -> float | None:
        """Energy counters' growth since the last call over the time between (W); the instant power
        on the first call or when a counter cannot be read."""
        energies = [r.energy_mj for r in readings.values()]
        previous, self._last_energy = self._last_energy, None
        if energies and all(e is not None for e in energies):
            total_mj = sum(e for e in energies if e is not None)
            self._last_energy = (now_s, total_mj)
            if previous is not None and now_s > previous[0] and total_mj >= previous[1]:
                return (total_mj - previous[1]) / 1000.0 / (now_s - previous[0])
        values = [r.power_w for r in readings.values()]
        if not values or any(v is None for v in values):
            return None
        return sum(v for v in values if v is not None)

"""The node power cap: a budget (admin) and/or a grant (a cluster pool), held by frontier points and limits.

Everything runs on the daemon's main loop (`tick`), except `apply_grant_w`, which any thread may call: it
only records the grant under a lock for the next tick. Each tick samples the energy counters (without
waiting), and when something changed (budget, grant, jobs, priorities) or every `recompute_s`, allocates
(`perseusd.power.allocate`), moves each job to its point (the straggler response re-decides, the cap is a
constraint on top) and writes the power limits (`perseusd.cap.limit_writer`: lower ones first, unchanged
ones not again, each only once the GPU's original state is durably saved).

The check: node power measured over the enforcement window from the energy counters trims the plan's target,
and falls back to strict limits when trimming is not enough (`perseusd.cap.measured_check`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from perseusd.cap.cap_file import SavedCap, resume_saved, save_logged
from perseusd.cap.job_loads import JobLoads
from perseusd.cap.limit_writer import LimitWriter
from perseusd.cap.measured_check import MeasuredCheck
from perseusd.cap.window import PowerWindow, WindowPower
from perseusd.errors import GpuError
from perseusd.gpu.registry import GpuRegistry
from perseusd.jobs.job import Job
from perseusd.jobs.manager import JobManager
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.restore import RestoreKeeper
from perseusd.power.allocate import ENFORCEMENTS, PLAN_HEADROOM, PRIORITIES, CapAllocation, allocate
from perseusd.power.allocate import demand_w as node_demand_w
from perseusd.power.allocate import floor_w as node_floor_w
from perseusd.power.allocate import priority_demand_w as node_priority_demand_w
from perseusd.power.cap_inputs import GpuRange, JobLoad

logger = logging.getLogger(__name__)

SAMPLE_PERIOD_S = 0.1
IDLE_SAMPLE_PERIOD_S = 1.0
"""Uncapped, the counters are read once a second (status still shows the node's power)."""
RECOMPUTE_S = 1.0


@dataclass(frozen=True)
class CapSettings:
    window_s: float = 1.0
    enforcement: str = "window"

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError("power_cap_window_s must be > 0")
        if self.enforcement not in ENFORCEMENTS:
            raise ValueError(f"power_cap_enforcement must be one of {', '.join(ENFORCEMENTS)}")


def priority_key(job: str, uid: int) -> str:
    """How a job's tier is keyed (in memory and in `power-cap.json`): its owner and its name."""
    return f"{uid}/{job}"


class NodeCap:
    """Implements `perseusd.power.target.NodePowerTarget` for this node (see the module)."""

    def __init__(
        self,
        registry: GpuRegistry,
        keeper: RestoreKeeper,
        leases: LeaseBook,
        jobs: JobManager | None,
        settings: CapSettings,
        *,
        clock_s: Callable[[], float] = time.monotonic,
        saved_path: Path | None = None,
    ) -> None:
        self._registry = registry
        self._saved_path = saved_path
        self.save_error = ""
        """Why the budget could not be saved for a restart ("" when it was)."""
        self._jobs = jobs
        self.settings = settings
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._pool_grant_w: float | None = None
        self._grant_changed = False
        self.budget_w: float | None = None
        self.set_by = ""
        self.priorities: dict[str, int] = {}
        self.allocation: CapAllocation | None = None
        self.writer = LimitWriter(registry, keeper, leases)
        self.window = PowerWindow(settings.window_s)
        self._dirty = False
        self._next_recompute_s = 0.0
        self._next_sample_s = 0.0
        self._reads: dict[str, Future[tuple[int, int]]] = {}
        self._job_loads = JobLoads(settings.window_s)
        self.last_loads: list[JobLoad] = []
        self._demand_w = sum(i.power_limit_max_w for i in registry.infos())
        self._priority_demand_w: dict[int, float] = {}
        self._demand_asked = False
        """Whether a pool agent asks for the demand: only then (or under a grant) the jobs' loads are kept
        up to date every `RECOMPUTE_S`; a node with no cap and no pool models nothing."""
        self._measured_w: float | None = None
        self.ranges = tuple(
            GpuRange(i.uuid, i.power_limit_min_w, i.power_limit_max_w) for i in registry.infos()
        )
        self.check = MeasuredCheck(self.window, settings.window_s, len(self.ranges))

    # ------------------------------------------------------------------ NodePowerTarget

    def power_demand_w(self) -> float:
        """As of the last tick (any thread may ask: the main loop refreshes it every `RECOMPUTE_S`)."""
        with self._lock:
            self._demand_asked = True
            return self._demand_w

    def power_floor_w(self) -> float:
        return node_floor_w(self.ranges)

    @property
    def demand_w(self) -> float:
        """The demand as last computed, without counting as a pool agent's question."""
        with self._lock:
            return self._demand_w

    def priority_demand_w(self) -> dict[int, float]:
        """As of the last tick (any thread may ask)."""
        with self._lock:
            self._demand_asked = True
            return dict(self._priority_demand_w)

    def measured_w(self) -> float | None:
        """The node's power over the last enforcement window (W, from the counters; any thread may ask)."""
        with self._lock:
            return self._measured_w

    def apply_grant_w(self, grant_w: float | None) -> None:
        with self._lock:
            if grant_w != self._pool_grant_w:
                self._pool_grant_w = grant_w
                self._grant_changed = True

    # ------------------------------------------------------------------ admin

    @property
    def pool_grant_w(self) -> float | None:
        with self._lock:
            return self._pool_grant_w

    @property
    def grant_w(self) -> float | None:
        """What the node is held to: the lower of the node budget and the pool grant (None: uncapped)."""
        held = [w for w in (self.budget_w, self.pool_grant_w) if w is not None]
        return min(held) if held else None

    @property
    def active(self) -> bool:
        return self.grant_w is not None or bool(self.writer.limits_w)

    def set_budget_w(self, budget_w: float | None, who: str) -> None:
        """Set (or with None clear) the node budget: saved for a restart first, then applied at once."""
        if budget_w is not None and not budget_w > 0:
            raise ValueError("the budget must be > 0 W")
        self.budget_w, self.set_by = budget_w, who
        self._save()
        self._changed()
        self.tick()

    def set_priority(self, job: str, uid: int, priority: int) -> None:
        """Give the job `job` of user `uid` a tier: bound to the job's identity (owner and name), never to
        the name alone, so another user's job of the same name later never gets it."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(map(str, PRIORITIES))} (0 lowest)")
        self.priorities[priority_key(job, uid)] = priority
        self._save()
        self._changed()

    def resume(self) -> None:
        """At start-up (the crashed daemon's GPUs reconciled, no job registered yet): set the budget and the
        priorities a previous daemon saved (`perseusd.cap.cap_file`)."""
        saved, self.save_error = resume_saved(self._saved_path)
        if saved is None:
            return
        self.priorities.update(saved.priorities)
        if saved.budget_w is not None:
            self.budget_w, self.set_by = saved.budget_w, saved.set_by
        self._changed()
        self.tick()

    def _save(self) -> None:
        if self._saved_path is not None:
            saved = SavedCap(self.budget_w, self.set_by, dict(self.priorities))
            self.save_error = save_logged(self._saved_path, saved, self.save_error)

    def _changed(self) -> None:
        self._dirty = True
        self.check.reset()

    # ------------------------------------------------------------------ main loop

    def tick(self) -> None:
        """Sample the counters; re-allocate and apply when due."""
        now_s = self._clock_s()
        self._sample(now_s)
        overwritten = self.writer.overwritten()
        if overwritten:
            self.after_restore(overwritten)
        with self._lock:
            if self._grant_changed:
                self._grant_changed = False
                self._changed()
        if not self._dirty and now_s < self._next_recompute_s:
            return
        self._dirty = False
        self._next_recompute_s = now_s + RECOMPUTE_S
        grant_w = self.grant_w
        with self._lock:
            demand_asked = self._demand_asked
        if grant_w is None and not demand_asked:
            self._uncap()
            return
        loads = self.refresh_demand()
        if grant_w is None:
            self._uncap()
            return
        self.check.watch(now_s, grant_w)
        enforcement = "strict" if self.check.forced_strict else self.settings.enforcement
        headroom = 1 - self.check.trim * (1 - PLAN_HEADROOM)
        allocation = allocate(self.ranges, loads, grant_w, enforcement=enforcement, headroom=headroom)
        if allocation.reason and (self.allocation is None or self.allocation.reason != allocation.reason):
            (logger.error if not allocation.feasible else logger.warning)("power cap: %s", allocation.reason)
        self.check.after_plan(now_s, self.allocation, allocation)
        self.allocation = allocation
        self._apply_points(allocation)
        self.writer.write(allocation.limits_w)

    def refresh_demand(self) -> list[JobLoad]:
        """Model the running jobs' loads now (main loop) and the node's demand; returns the loads."""
        loads = self.last_loads = self._loads()
        with self._lock:
            self._demand_w = node_demand_w(self.ranges, loads)
            self._priority_demand_w = node_priority_demand_w(self.ranges, loads)
        return loads

    def measured(self) -> WindowPower | None:
        return self.window.power()

    def job(self, name: str) -> Job | None:
        """The active job of that name on this node (None: none)."""
        job = None if self._jobs is None else self._jobs.jobs.get(name)
        return job if job is not None and job.active else None

    def _loads(self) -> list[JobLoad]:
        if self._jobs is None:
            return []
        return self._job_loads.loads(self._jobs.jobs.values(), self.priorities)

    def _sample(self, now_s: float) -> None:
        """Collect finished counter reads into the window; start the next ones when due (never waits)."""
        if self._reads and all(f.done() for f in self._reads.values()):
            energies: dict[str, float] = {}
            stamps: list[int] = []
            for uuid, future in self._reads.items():
                try:
                    t_ns, mj = future.result()
                except Exception:  # a GPU that cannot be read is left out of this sample
                    continue
                energies[uuid] = mj / 1000.0
                stamps.append(t_ns)
            if stamps:
                self.window.add(sum(stamps) / len(stamps) / 1e9, energies)
                reading = self.window.power()
                with self._lock:
                    self._measured_w = reading.power_w if reading is not None else None
            self._reads = {}
        if not self._reads and now_s >= self._next_sample_s:
            self._next_sample_s = now_s + (SAMPLE_PERIOD_S if self.active else IDLE_SAMPLE_PERIOD_S)
            for uuid in self._registry.uuids:
                try:
                    self._reads[uuid] = self._registry.submit_read_energy(uuid)
                except GpuError:
                    continue

    @property
    def plan_target_w(self) -> float | None:
        """What the plan aims at (W): the grant, less the headroom, trimmed by what was measured."""
        grant_w = self.grant_w
        return None if grant_w is None else grant_w * self.check.trim * (1 - PLAN_HEADROOM)

    def _apply_points(self, allocation: CapAllocation) -> None:
        if self._jobs is None:
            return
        granted = {g.name: g.index for g in allocation.jobs}
        for job in self._jobs.jobs.values():
            index = granted.get(job.name)
            if index != job.cap_index:
                job.cap_index = index
                if job.deployed is not None:
                    self._jobs.response.decide(job)

    def _uncap(self) -> None:
        """No budget, no grant: every limit the cap wrote goes back to the GPU's original."""
        if self._jobs is not None:
            for job in self._jobs.jobs.values():
                if job.cap_index is not None:
                    job.cap_index = None
                    if job.deployed is not None:
                        self._jobs.response.decide(job)
        self.writer.restore()
        self.allocation = None
        self.check.over_windows = 0

    def after_restore(self, gpus: Iterable[str]) -> None:
        """These GPUs' limits were written outside the cap (restored to their originals by a release, a dead
        client or an admin reset, or set by an admin): write the cap's again at the next tick."""
        self.writer.forget(gpus)
        if self.grant_w is not None:
            self._dirty = True

"""The node power cap: a budget (admin) and/or a grant (a cluster pool), held by frontier points and limits.

Everything runs on the daemon's main loop (`tick`), except `apply_grant_w`, which any thread may call: it
only records the grant under a lock for the next tick. Each tick samples the energy counters (without
waiting), and when something changed (budget, grant, jobs, priorities) or every `recompute_s`, allocates
(`perseusd.power.allocate`), moves each job to its point (the straggler response re-decides, the cap is a
constraint on top) and writes the power limits: lower ones first, then raised ones, so that the limits'
sum never passes the higher of the old and new sums; a limit that did not change is not written again,
and once per recompute the GPUs are read (without waiting) to find a limit something else wrote over
(`perseusd.cap.limit_check`). A limit is written only after the GPU's original state is durably saved
(the restore machinery), so cap clear, daemon stop and start-up after a crash restore it like a clock.

The check: node power measured over the enforcement window from the energy counters. A window above the
grant trims the plan's target by the excess (a plan switching clocks late draws more than its profile says);
under `window` enforcement, a node still measured above the grant + 1 % for `WATCHDOG_WINDOWS` windows in a
row with the trim at its floor falls back to strict limits (logged, and shown in status) until the cap
changes.
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
from perseusd.cap.limit_check import LimitCheck
from perseusd.cap.window import PowerWindow, WindowPower
from perseusd.errors import GpuError
from perseusd.gpu.registry import GpuRegistry
from perseusd.jobs.job import Job
from perseusd.jobs.manager import JobManager
from perseusd.leasing.leases import LeaseBook
from perseusd.leasing.restore import RestoreKeeper
from perseusd.leasing.state_file import StateWriteError
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
OVER_TOLERANCE = 0.01
WATCHDOG_WINDOWS = 3
TRIM_MIN = 0.85
TRIM_STEP = 0.97
"""The most one check trims the plan's target by."""
QUIET_WINDOWS = 3
"""Windows after a change of points or limits that the measured check ignores (jobs switch at an iteration
boundary; the window still holds the old power)."""
TRIM_RELAX = 1.002


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
        self._keeper = keeper
        self._leases = leases
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
        self.limits_w: dict[str, float] = {}
        self._enforced_w: dict[str, float] = {}
        """What each GPU enforced of the limit the cap wrote (W)."""
        self._check = LimitCheck(registry)
        self.window = PowerWindow(settings.window_s)
        self.over_windows = 0
        self.forced_strict = False
        self.trim = 1.0
        self.write_error = ""
        self._dirty = False
        self._next_recompute_s = 0.0
        self._next_sample_s = 0.0
        self._next_check_s = 0.0
        self._quiet_until_s = 0.0
        self._reads: dict[str, Future[tuple[int, int]]] = {}
        self._job_loads = JobLoads(settings.window_s)
        self.last_loads: list[JobLoad] = []
        self._demand_w = sum(i.power_limit_max_w for i in registry.infos())
        self._priority_demand_w: dict[int, float] = {}
        self._demand_asked = False
        """Whether a pool agent asks for the demand: only then (or under a grant) the jobs' loads are kept
        up to date every `RECOMPUTE_S`; a node with no cap and no pool models nothing."""
        self._measured_w: float | None = None
        self.ranges = self._ranges = tuple(
            GpuRange(i.uuid, i.power_limit_min_w, i.power_limit_max_w) for i in registry.infos()
        )

    # ------------------------------------------------------------------ NodePowerTarget

    def power_demand_w(self) -> float:
        """As of the last tick (any thread may ask: the main loop refreshes it every `RECOMPUTE_S`)."""
        with self._lock:
            self._demand_asked = True
            return self._demand_w

    def power_floor_w(self) -> float:
        return node_floor_w(self._ranges)

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
        return self.grant_w is not None or bool(self.limits_w)

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
        self.trim = 1.0
        self.forced_strict = False
        self.over_windows = 0

    # ------------------------------------------------------------------ main loop

    def tick(self) -> None:
        """Sample the counters; re-allocate and apply when due."""
        now_s = self._clock_s()
        self._sample(now_s)
        overwritten = self._check.overwritten(self.limits_w)
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
        self._watch(now_s, grant_w)
        enforcement = "strict" if self.forced_strict else self.settings.enforcement
        headroom = 1 - self.trim * (1 - PLAN_HEADROOM)
        allocation = allocate(self._ranges, loads, grant_w, enforcement=enforcement, headroom=headroom)
        if allocation.reason and (self.allocation is None or self.allocation.reason != allocation.reason):
            (logger.error if not allocation.feasible else logger.warning)("power cap: %s", allocation.reason)
        if self.allocation is None or _moved(self.allocation, allocation):
            # the windows measured next still hold the old plan's power: they must not trim the new one
            self._quiet_until_s = now_s + QUIET_WINDOWS * self.settings.window_s
        self.allocation = allocation
        self._apply_points(allocation)
        self._write_limits(allocation.limits_w)
        self._check.submit(self.limits_w, self._enforced_w)

    def refresh_demand(self) -> list[JobLoad]:
        """Model the running jobs' loads now (main loop) and the node's demand; returns the loads."""
        loads = self.last_loads = self._loads()
        with self._lock:
            self._demand_w = node_demand_w(self._ranges, loads)
            self._priority_demand_w = node_priority_demand_w(self._ranges, loads)
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

    def _watch(self, now_s: float, grant_w: float) -> None:
        """Once a window, the measured power corrects the plan: above the grant, the plan's target is
        trimmed by the excess (down to `TRIM_MIN`); well below it, the trim relaxes slowly. Windows above the
        grant + 1 % with the trim at its floor fall back to strict limits after `WATCHDOG_WINDOWS`."""
        if now_s < max(self._next_check_s, self._quiet_until_s):
            return
        self._next_check_s = now_s + self.settings.window_s
        reading = self.window.power()
        if reading is None or reading.gpus < len(self._ranges):
            return
        # The trim follows two windows: a counter that lags reads one window low and the next one high.
        steady = self.window.power(2 * self.settings.window_s)
        if steady is not None and steady.gpus == len(self._ranges):
            if steady.power_w > grant_w:
                self.trim = max(TRIM_MIN, self.trim * max(TRIM_STEP, grant_w / steady.power_w))
            elif steady.power_w < grant_w * (1 - 2 * PLAN_HEADROOM):
                self.trim = min(1.0, self.trim * TRIM_RELAX)
        if reading.power_w > grant_w * (1 + OVER_TOLERANCE):
            self.over_windows += 1
            if self.over_windows >= WATCHDOG_WINDOWS and self.trim <= TRIM_MIN and not self.forced_strict:
                self.forced_strict = True
                logger.warning(
                    "power cap: %.0f W measured over %.1f s > grant %.0f W for %d windows: strict limits",
                    reading.power_w,
                    reading.span_s,
                    grant_w,
                    self.over_windows,
                )
        else:
            self.over_windows = 0

    @property
    def plan_target_w(self) -> float | None:
        """What the plan aims at (W): the grant, less the headroom, trimmed by what was measured."""
        grant_w = self.grant_w
        return None if grant_w is None else grant_w * self.trim * (1 - PLAN_HEADROOM)

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

    def _write_limits(self, limits_w: dict[str, float]) -> None:
        """Lower limits first (all GPUs at once), then raised ones: the sum never passes the higher of the
        old and new sums. A GPU is written only once its original is durably saved."""
        lower = [u for u in limits_w if limits_w[u] < self.limits_w.get(u, float("inf"))]
        errors = self._write_batch(lower, limits_w)
        errors += self._write_batch([u for u in limits_w if u not in lower], limits_w)
        if errors and "; ".join(errors) != self.write_error:
            logger.error("power cap: cannot write power limits: %s", "; ".join(errors))
        self.write_error = "; ".join(errors)

    def _write_batch(self, uuids: list[str], limits_w: dict[str, float]) -> list[str]:
        """Write these GPUs' limits in parallel and wait for them. A limit the cap wrote and nothing wrote
        over since (`after_restore`, `LimitCheck`) is not written again: the main loop then waits for no
        owner thread, which may be inside a clock set (~10 ms on an H100), at every recompute."""
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

    def _uncap(self) -> None:
        """No budget, no grant: every limit the cap wrote goes back to the GPU's original."""
        if self._jobs is not None:
            for job in self._jobs.jobs.values():
                if job.cap_index is not None:
                    job.cap_index = None
                    if job.deployed is not None:
                        self._jobs.response.decide(job)
        for uuid in sorted(self.limits_w):
            self._restore_limit(uuid)
        self.limits_w.clear()
        self.allocation = None
        self.over_windows = 0

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

    def after_restore(self, gpus: Iterable[str]) -> None:
        """These GPUs' limits were written outside the cap (restored to their originals by a release, a dead
        client or an admin reset, or set by an admin): write the cap's again at the next tick."""
        for uuid in gpus:
            self.limits_w.pop(uuid, None)
        if self.grant_w is not None:
            self._dirty = True


def _moved(old: CapAllocation, new: CapAllocation) -> bool:
    """Whether a new allocation changes a job's point or a limit by more than a watt."""
    if {g.name: g.index for g in old.jobs} != {g.name: g.index for g in new.jobs}:
        return True
    if old.limits_w.keys() != new.limits_w.keys():
        return True
    return any(abs(old.limits_w[u] - w) > 1.0 for u, w in new.limits_w.items())

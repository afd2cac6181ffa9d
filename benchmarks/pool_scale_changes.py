"""The budget changes of `bench_pool_scale.py`: seeded budgets between the pool's floors and its demand, set
by the admin one after the other; for every node whose grant changed, the time from the write to the node
applying its new grant; where each change's time went (`phase_profile`, from the invariant watch's arrival
times: the lowering and raising transactions, the reports between, and the allocator's own reads and
transactions), and the CPU of each kind of process while the changes ran (`cpu_split`).

`budget_changes` leaves the phases of its last run in `phases` and the CPU cores in `cpu_during_changes`.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from benchmarks.pool_scale_fleet import Fleet, settle
from benchmarks.pool_scale_invariant import TOLERANCE_W
from benchmarks.processes import process_cpu_s
from perseusd.pool.admin import set_budget

phases: list[dict[str, Any]] = []
"""Each budget change's `phase_profile` (with the allocator's calls), from the last `budget_changes`."""
cpu_during_changes: dict[str, float] = {}
"""CPU cores of each kind of process (`cpu_split`'s) while the last `budget_changes` ran."""


def phase_profile(
    fleet: Fleet, set_at: float, done_at: float, targets: dict[str, float], before: dict[str, float | None]
) -> dict[str, Any]:
    """Where one budget change's time went, from the invariant watch's arrival times (s after the set)."""
    rows = [r for r in list(fleet.invariant.timeline) if set_at <= r[0] <= done_at + 0.5]
    lowers = [r for r in rows if r[2]]
    raises = [r for r in rows if r[3]]
    first_raise = raises[0][0] if raises else None
    acks = [r for r in rows if r[4] and (first_raise is None or r[0] <= first_raise)]
    n_lowered = sum(1 for n, w in targets.items() if (before.get(n) or 0.0) > w + TOLERANCE_W)
    n_raised = sum(1 for n, w in targets.items() if (before.get(n) or 0.0) < w - TOLERANCE_W)

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - set_at, 3)

    return {
        "nodes_lowered": n_lowered,
        "nodes_raised": n_raised,
        "first_lower_s": rel(lowers[0][0] if lowers else None),
        "last_lower_s": rel(lowers[-1][0] if lowers else None),
        "lower_txns": len(lowers),
        "last_ack_before_raise_s": rel(acks[-1][0] if acks else None),
        "first_raise_s": rel(first_raise),
        "last_raise_s": rel(raises[-1][0] if raises else None),
        "raise_txns": len(raises),
        "all_held_s": rel(done_at),
        "revisions": len(rows),
        "report_writes": sum(r[4] for r in rows),
    }


def budget_changes(fleet: Fleet, changes: int, rng: random.Random) -> tuple[list[float], list[float]]:
    view = fleet.view()
    floor_w = sum(r.report.floor_w for r in view.reports.values())
    demand_w = sum(r.report.demand_w for r in view.reports.values())
    latencies: list[float] = []
    per_change_max: list[float] = []
    phases.clear()
    cpu0 = cpu_split(fleet)
    windows: list[tuple[float, float]] = []
    for _ in range(changes):
        budget_w = round(floor_w + rng.uniform(0.3, 0.95) * (demand_w - floor_w), 1)
        before = fleet.held()
        targets = fleet.targets(budget_w)
        set_at = time.monotonic()
        set_budget(fleet.store, fleet.keys, budget_w, "bench")
        times = settle(fleet, targets, set_at, 120.0)
        moved = [times[n] for n, w in targets.items() if _moved(before.get(n), w)]
        latencies += moved
        per_change_max.append(max(moved, default=0.0))
        done_at = set_at + max(times.values(), default=0.0)
        phases.append(phase_profile(fleet, set_at, done_at, targets, before))
        windows.append((set_at, done_at))
        time.sleep(2.0)
    cpu1 = cpu_split(fleet)
    cpu_during_changes.clear()
    cpu_during_changes.update(
        {k: round((cpu1[k] - cpu0[k]) / (cpu1["wall"] - cpu0["wall"]), 2) for k in cpu0 if k != "wall"}
    )
    calls = fleet.workers[0].get_stats().get(fleet.names[0], {}).get("calls", [])
    for phase, (set_at, done_at) in zip(phases, windows, strict=True):
        phase["allocator_calls"] = [
            f"{what} {round(start - set_at, 3)}+{round(took, 3)} ({size})"
            for what, start, took, size in calls
            if set_at - 0.2 <= start <= done_at + 0.5
        ]
    return latencies, per_change_max


def _moved(before_w: float | None, target_w: float) -> bool:
    return before_w is None or abs(before_w - target_w) > TOLERANCE_W


def cpu_split(fleet: Fleet) -> dict[str, float]:
    """CPU seconds so far of the allocator's process, the other agents', etcd's members and this one."""
    own = os.times()
    return {
        "allocator_process": fleet.workers[0].cpu_s(),
        "agent_processes": sum(w.cpu_s() for w in fleet.workers[1:]),
        "etcd": sum(process_cpu_s(m.process.pid) for m in fleet.etcd.members if m.process is not None),
        "bench": own.user + own.system,
        "wall": time.monotonic(),
    }

"""The failures `bench_pool_scale.py` times: a node hung (it stops renewing its lease: the time until every
other node holds the share it got back, and until its report expires), and the allocator's process SIGKILLed
just after the first transaction of a budget change (the time until every node holds its grant under the
new allocator).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from benchmarks.pool_scale_changes import phase_profile
from benchmarks.pool_scale_fleet import Fleet, settle, wait
from benchmarks.pool_scale_invariant import TOLERANCE_W
from perseusd.pool.admin import set_budget


def kill_node(fleet: Fleet) -> dict[str, Any]:
    allocator = fleet.allocator()
    victim = next(n for n in reversed(fleet.names) if n != allocator)
    active = fleet.view().active
    assert active is not None
    targets = fleet.targets(active.budget_w, without={victim})
    before = fleet.held()
    changed = {n: w for n, w in targets.items() if abs((before.get(n) or 0) - w) > TOLERANCE_W}
    hung_at = time.monotonic()
    fleet.worker_of(victim).send(f"hang {victim}")
    times = settle(fleet, changed, hung_at, 120.0 + fleet.ttl_s)
    wait(lambda: victim in fleet.invariant.deleted_at, 60.0, "the report to expire")
    return {
        "node": victim,
        "ttl_s": fleet.ttl_s,
        "nodes_whose_share_grew": len(changed),
        "share_redistributed_s": round(max(times.values(), default=0.0), 3),
        "lease_expired_s": round(fleet.invariant.deleted_at[victim] - hung_at, 3),
        "phases": phase_profile(
            fleet, hung_at, hung_at + max(times.values(), default=0.0), changed, dict(before)
        ),
    }


def kill_allocator(fleet: Fleet) -> dict[str, Any]:
    """SIGKILL the allocator's process just after the first transaction of a budget change (lower)."""
    allocator = fleet.allocator()
    assert allocator is not None
    worker = fleet.worker_of(allocator)
    view = fleet.view()
    assert view.active is not None
    budget_w = round(0.9 * view.active.budget_w, 1)
    survivors = {n for n in view.reports if n not in worker.nodes}
    targets = {n: w for n, w in fleet.targets(budget_w, without=set(worker.nodes)).items() if n in survivors}
    first = fleet.invariant.grant_events
    set_at = time.monotonic()
    set_budget(fleet.store, fleet.keys, budget_w, "bench")
    wait(lambda: fleet.invariant.grant_events > first, 60.0, "the first move", 0.002)
    killed_at = time.monotonic()
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    times = settle(fleet, targets, killed_at, 120.0 + 2 * fleet.ttl_s)
    return {
        "killed": allocator,
        "killed_after_set_s": round(killed_at - set_at, 3),
        "new_allocator": fleet.allocator(),
        "every_node_held_its_grant_s": round(max(times.values(), default=0.0), 3),
        "ttl_s": fleet.ttl_s,
    }

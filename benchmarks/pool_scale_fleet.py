"""N pool agents on one etcd for `bench_pool_scale.py`: the allocator (the first node) alone in its process,
the other agents packed `per_process` to a `pool_scale_worker.py` process (consecutive names, or dealt round
robin), the admin's store and the invariant watch; the pool's view, the grants an allocation gives, what each
node holds and when it first held a target (`settle` waits for every node), and `wait` for a condition.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.pool_scale_invariant import TOLERANCE_W, InvariantWatch
from benchmarks.pool_scale_process import POOL, PREFIX, Worker
from perseusd.cluster.config import parse_endpoint
from perseusd.cluster.etcd_store import EtcdStore
from perseusd.pool.alloc import allocate
from perseusd.pool.keys import PoolKeys
from perseusd.pool.view import PoolView, read_pool
from tests.support.etcd_cluster import EtcdCluster


class Fleet:
    """N agents, an admin store and the invariant watch on one etcd."""

    def __init__(
        self,
        etcd: EtcdCluster,
        nodes: int,
        per_process: int,
        ttl_s: int,
        interval_s: float,
        absent_node: str = "release",
        interleave: bool = False,
        serial_parts: bool = False,
    ) -> None:
        self.etcd, self.ttl_s = etcd, ttl_s
        self.keys = PoolKeys(PREFIX, POOL)
        self.store = EtcdStore([parse_endpoint(e) for e in etcd.endpoints], timeout_s=5.0, attempts=9)
        start = self.store.range_prefix(self.keys.root)[0]
        self.invariant = InvariantWatch(etcd.endpoints[0], self.keys, start + 1)
        endpoints = ",".join(etcd.endpoints)
        names = [f"node-{i:04d}" for i in range(nodes)]
        policy = ("--absent-node", absent_node, *(("--serial-parts",) if serial_parts else ()))
        self.workers = [Worker(endpoints, names[:1], ttl_s, interval_s, policy)]
        wait(lambda: self.allocator() == names[0], 30.0, "the first node to allocate")
        rest = names[1:]
        if interleave:  # node i to process i % P: a transaction's nodes spread as over machines
            count = -(-len(rest) // per_process)
            groups = [rest[k::count] for k in range(count)]
        else:  # consecutive names to one process: a whole transaction's nodes share one GIL
            groups = [rest[i : i + per_process] for i in range(0, len(rest), per_process)]
        for group in groups:
            self.workers.append(Worker(endpoints, group, ttl_s, interval_s, policy))
        for worker in self.workers:
            worker.started.wait(120)
        wait(lambda: len(self.view().reports) == nodes, 120.0, "every node's report")
        self.names = names

    def view(self) -> PoolView:
        revision, entries = self.store.range_prefix(self.keys.root)
        return read_pool(self.keys, revision, entries)

    def allocator(self) -> str | None:
        return self.view().allocator_node

    def targets(self, budget_w: float, without: set[str] = frozenset()) -> dict[str, float]:  # type: ignore[assignment]
        view = self.view()
        needs = [r.report.need(n) for n, r in sorted(view.reports.items()) if n not in without]
        return allocate(budget_w, needs).grants_w

    def held(self) -> dict[str, float | None]:
        """Each node's last applied grant (from the workers' events)."""
        last: dict[str, float | None] = {}
        for worker in self.workers:
            for node, grant_w, _t in list(worker.events):
                last[node] = grant_w
        return last

    def reached(self, targets: dict[str, float], since_t: float) -> dict[str, float]:
        """For each node, when it first applied its target after `since_t` (monotonic)."""
        when: dict[str, float] = {}
        for worker in self.workers:
            for node, grant_w, t in list(worker.events):
                if t < since_t or node not in targets or grant_w is None:
                    continue
                if abs(grant_w - targets[node]) <= TOLERANCE_W:
                    when.setdefault(node, t)
                else:
                    when.pop(node, None)  # moved away again: the last arrival counts
        return when

    def worker_of(self, node: str) -> Worker:
        return next(w for w in self.workers if node in w.nodes)

    def close(self) -> None:
        for worker in self.workers:
            worker.send("quit")
        for worker in self.workers:
            worker.close()
        self.invariant.close()
        self.store.close()


def wait(predicate: Any, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    start_s = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start_s
        except Exception:
            pass
        if time.monotonic() - start_s > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def settle(fleet: Fleet, targets: dict[str, float], since_t: float, timeout_s: float) -> dict[str, float]:
    """Wait until every node in `targets` applies its target; per node, seconds after `since_t`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        when = fleet.reached(targets, since_t)
        if len(when) == len(targets):
            return {n: t - since_t for n, t in when.items()}
        time.sleep(0.1)
    when = fleet.reached(targets, since_t)
    missing = sorted(set(targets) - set(when))
    raise TimeoutError(f"{len(missing)} nodes never held their grants, e.g. {missing[:5]}")

"""A power pool of real daemons (simulated GPUs) on a real etcd, for tests and the benchmark.

`PoolRun` starts daemons that join one pool, sets budgets as an admin would (the same functions the admin
socket calls), reads the pool, reads each daemon's simulated GPUs' power limits, and checks the grant
invariant at every etcd revision of a run by reading the pool as of each revision (etcd's history).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from perseusd.cluster.config import ClusterConfig, parse_endpoint
from perseusd.cluster.etcd_store import EtcdStore
from perseusd.gpu.sim_shared import StateMap
from perseusd.pool.admin import PoolStatus, pool_status, release_node, set_budget
from perseusd.pool.agent import PoolAgent, PoolSettings
from perseusd.pool.alloc import NodeNeed, allocate
from perseusd.pool.keys import PoolKeys
from perseusd.pool.view import PoolView, read_pool
from tests.support.ctl import run_ctl
from tests.support.etcd_cluster import EtcdCluster
from tests.support.lockstep import cluster_env
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

PREFIX = "/perseus/v1"
TOLERANCE_W = 1e-6
FLOOR_W, DEMAND_W = 800.0, 3200.0
"""A fleet node's floor and its largest demand (`SimNode.fleet`)."""


class SimNode:
    """A node's GPUs as a `NodePowerTarget`, for agents run in the test's process: what it was last told
    to hold."""

    def __init__(self, demand_w: float, floor_w: float = FLOOR_W) -> None:
        self.demand_w = demand_w
        self.floor_w = floor_w
        self.held: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def fleet(cls, index: int) -> SimNode:
        """The `index`-th node of a fleet: demands of 3,200 to 2,900 W in turn, an 800 W floor."""
        return cls(DEMAND_W - (index % 4) * 100.0)

    def power_demand_w(self) -> float:
        return self.demand_w

    def power_floor_w(self) -> float:
        return self.floor_w

    def priority_demand_w(self) -> dict[int, float]:
        return {}

    def apply_grant_w(self, grant_w: float | None) -> None:
        with self._lock:
            self.held = grant_w


def fleet_nodes(prefix: str, count: int) -> dict[str, SimNode]:
    """`count` fleet nodes (`SimNode.fleet`) named `<prefix><index>`, every index as wide as the last."""
    width = len(str(count - 1))
    return {f"{prefix}{i:0{width}d}": SimNode.fleet(i) for i in range(count)}


def held_everywhere(sims: Mapping[str, SimNode], budget_w: float, reserved_w: float = 0.0) -> bool:
    """Whether every fleet node holds its share of `budget_w` less `reserved_w` (the absent nodes'), as
    `allocate` divides it among the nodes' demands over the fleet's floor."""
    needs = [NodeNeed(node, sim.demand_w, FLOOR_W, {}) for node, sim in sorted(sims.items())]
    return all(sims[n].held == w for n, w in allocate(budget_w, needs, reserved_w).grants_w.items())


@dataclass
class InvariantCheck:
    """The grant invariant over a range of revisions: every revision read, every violation listed."""

    first: int
    last: int
    revisions: int = 0
    grant_revisions: int = 0
    """Revisions at which at least one grant existed."""
    violations: list[str] = field(default_factory=list)
    max_ratio: float = 0.0
    """The largest sum of grants / active budget seen."""
    raised_early: list[str] = field(default_factory=list)
    """Revisions at which a grant rose while a node whose grant was lowered had not reported applying it
    (its report's watts above its grant, or its report older than the lowered grant's revision)."""


class PoolRun:
    """Daemons in one pool (see module). `close()` stops every daemon and removes their directories."""

    def __init__(self, etcd: EtcdCluster, pool: str, ttl_s: int = 3, interval_s: float = 0.2) -> None:
        self.etcd, self.pool, self.ttl_s, self.interval_s = etcd, pool, ttl_s, interval_s
        self.keys = PoolKeys(PREFIX, pool)
        self.store = EtcdStore([parse_endpoint(e) for e in etcd.endpoints], timeout_s=1.0, attempts=9)
        self.daemons: dict[str, DaemonProcess] = {}

    def env(
        self, node: str, safe_cap_w: float = 0.0, target: str = "uniform", absent_node: str = "hold"
    ) -> dict[str, str]:
        return cluster_env(self.etcd, node, self.ttl_s, self.interval_s) | {
            "PERSEUSD_POWER_POOL": self.pool,
            "PERSEUSD_POWER_POOL_SAFE_CAP_W": str(safe_cap_w),
            "PERSEUSD_POWER_POOL_TARGET": target,
            "PERSEUSD_POWER_POOL_ABSENT_NODE": absent_node,
        }

    def start_node(
        self,
        node: str,
        gpus: int = 2,
        safe_cap_w: float = 0.0,
        target: str = "uniform",
        absent_node: str = "hold",
    ) -> DaemonProcess:
        """A daemon in the pool; `target` is its `power_pool_target` (the tests of the pool's own mechanics
        use "uniform": its limits are the grant, to the watt), `absent_node` its `power_pool_absent_node`."""
        env = self.env(node, safe_cap_w, target, absent_node)
        daemon = DaemonProcess(DaemonDirs.create(), gpus=gpus, env=env)
        self.daemons[node] = daemon
        return daemon.start()

    @contextmanager
    def agents_in_process(
        self,
        sims: Mapping[str, SimNode],
        settings: Callable[[str], PoolSettings],
        refresh_interval_s: float = 0.3,
    ) -> Iterator[dict[str, PoolAgent]]:
        """A real `PoolAgent` in this process for each node of `sims` (its own store, lease, watches and
        thread), on this run's etcd with its lease TTL, holding what it is granted on its `SimNode`; node
        `n`'s settings are `settings(n)`. Started in order; every agent started is stopped on exit."""
        agents: dict[str, PoolAgent] = {}
        try:
            for node, sim in sims.items():
                config = ClusterConfig(
                    self.etcd.endpoints, node, self.ttl_s, 1.0, refresh_interval_s=refresh_interval_s
                )
                agents[node] = PoolAgent(config, settings(node), sim)
                agents[node].start()
            yield agents
        finally:
            for agent in agents.values():
                agent.stop()

    def set_budget(self, budget_w: float | None) -> None:
        set_budget(self.store, self.keys, budget_w, "test")

    def ctl(self, node: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`perseusctl` against `node`'s daemon (as root: its admin socket)."""
        return run_ctl(self.daemons[node].dirs.runtime_dir, *args, timeout_s=60)

    def view(self) -> PoolView:
        return read_pool(self.keys, *self.store.range_prefix(self.keys.root))

    def status(self) -> PoolStatus:
        return pool_status(self.store, self.keys)

    def release(self, node: str) -> float:
        """An admin's `cap-pool release` of `node` (the function the admin socket calls)."""
        return release_node(self.store, self.keys, node, "test")

    def reserved(self) -> dict[str, float]:
        """The absent nodes' reservations (W)."""
        return {n.node: n.reserved_w for n in self.status().nodes if n.reserved_w is not None}

    def revision(self) -> int:
        return self.store.range_prefix(self.keys.root)[0]

    def gpu_limits_w(self, node: str) -> float:
        """The sum of the power limits the node's simulated GPUs hold now (W)."""
        total_w = 0.0
        for path in sorted((self.daemons[node].dirs.runtime_dir / "sim").glob("*.state")):
            state = StateMap(path, writable=False)
            try:
                total_w += state.read_control().power_limit_w
            finally:
                state.close()
        return total_w

    def move_gpu_limit(self, node: str, limit_w: float) -> None:
        """Set the first simulated GPU's limit behind the daemon's back (as a restore of another's would)."""
        path = sorted((self.daemons[node].dirs.runtime_dir / "sim").glob("*.state"))[0]
        state = StateMap(path, writable=True)
        try:
            state.write_control(replace(state.read_control(), power_limit_w=limit_w))
        finally:
            state.close()

    def settled(self, budget_w: float) -> Callable[[], bool]:
        """A predicate: the active budget is `budget_w`, every node reporting has the grant the allocation
        gives it, and applies it."""

        def check() -> bool:
            revision, entries = self.store.range_prefix(self.keys.root)
            view = read_pool(self.keys, revision, entries)
            if view.active is None or view.active.budget_w != budget_w or not view.reports:
                return False
            needs = [r.report.need(n) for n, r in sorted(view.reports.items())]
            wanted = allocate(budget_w, needs, view.reserved_w).grants_w
            grants = {n: g.grant_w for n, g in view.grants.items() if n in view.reports}
            applied = {n: r.report.applied_w for n, r in view.reports.items()}
            return grants == wanted and applied == wanted

        return check

    def check_invariant(self, first: int, last: int) -> InvariantCheck:
        """Read the pool as of every revision in [first, last]: the sum of the grants never exceeds the
        active budget, and no grant exists without one (but an absent node's, kept reserved)."""
        result = InvariantCheck(first, last)
        previous: PoolView | None = None
        for revision in range(first, last + 1):
            view = read_pool(self.keys, revision, self.store.range_prefix(self.keys.root, revision)[1])
            if previous is not None:
                _check_order(previous, view, result)
            previous = view
            result.revisions += 1
            if not view.grants:
                continue
            result.grant_revisions += 1
            if view.active is None:
                if set(view.grants) & set(view.reports):
                    result.violations.append(f"revision {revision}: grants without an active budget")
                continue
            granted_w = view.granted_w
            if view.active.budget_w > 0:
                result.max_ratio = max(result.max_ratio, granted_w / view.active.budget_w)
            if granted_w > view.active.budget_w + TOLERANCE_W:
                result.violations.append(
                    f"revision {revision}: grants {granted_w:.1f} W > budget {view.active.budget_w:.1f} W"
                )
        return result

    def close(self) -> None:
        for daemon in self.daemons.values():
            daemon.stop()
        for daemon in self.daemons.values():
            shutil.rmtree(daemon.dirs.base, ignore_errors=True)
        self.store.close()


def _check_order(before: PoolView, view: PoolView, result: InvariantCheck) -> None:
    """Lowered grants applied before any grant rises (see `InvariantCheck.raised_early`)."""
    raised = [
        n for n, g in view.grants.items() if n not in before.grants or g.grant_w > before.grants[n].grant_w
    ]
    if not raised:
        return
    behind = []
    for node, grant in before.grants.items():
        report = before.reports.get(node)
        if report is None or node in raised:
            continue
        applied_w, applied_at = report.report.applied_w, report.report.applied_revision
        lowered = (
            grant.held_w is not None and applied_at is not None and applied_at < grant.entry.mod_revision
        )
        if lowered or (applied_w is not None and applied_w > grant.grant_w + 0.05):
            behind.append(node)
    if behind:
        result.raised_early.append(f"revision {view.revision}: {raised[:3]} raised while {behind[:3]} behind")


def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until `predicate` held, None if it did not within `timeout_s` (etcd errors count as no)."""
    start_s = time.monotonic()
    while time.monotonic() - start_s <= timeout_s:
        try:
            if predicate():
                return time.monotonic() - start_s
        except Exception:  # a transient etcd error while members restart: try again
            pass
        time.sleep(poll_s)
    return None

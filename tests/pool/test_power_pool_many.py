"""A pool of more nodes than etcd takes operations in one transaction (128), on a real 3-member etcd.

140 real `PoolAgent`s in this process (each with its own store, lease, watches and thread; a simulated node
behind each) join one pool. A budget is set and lowered: every node must hold the allocation, the
allocator's moves must have been split into several transactions, as full as etcd takes, the nodes that do
not allocate must never have read the whole pool, and the grant invariant must hold at every etcd revision
of the run. Then
the allocator is stopped without revoking its lease (as if killed): another node takes over, keeps the
dead node's grant reserved, and moves the grants of the next budget. The large-N numbers are
`benchmarks/bench_pool_scale.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perseusd.pool.agent import PoolAgent, PoolSettings
from perseusd.pool.move_writer import ETCD_MAX_TXN_OPS
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.power_pool import PoolRun, SimNode, fleet_nodes, held_everywhere, wait_for

pytestmark = [requires_etcd, pytest.mark.timeout(300)]

NODES, TTL_S = 140, 3


@pytest.fixture
def fleet(etcd: EtcdCluster) -> Iterator[tuple[PoolRun, dict[str, PoolAgent], dict[str, SimNode]]]:
    etcd.restart()
    run = PoolRun(etcd, "many", ttl_s=TTL_S)
    sims = fleet_nodes("n", NODES)
    try:
        with run.agents_in_process(sims, lambda _node: PoolSettings("many")) as agents:
            yield run, agents, sims
    finally:
        run.close()


def test_more_nodes_than_a_transaction_holds(
    fleet: tuple[PoolRun, dict[str, PoolAgent], dict[str, SimNode]],
) -> None:
    run, agents, sims = fleet
    assert wait_for(lambda: len(run.status().nodes) == NODES, 60.0) is not None
    first = run.revision()
    demand_w = sum(s.demand_w for s in sims.values())
    for budget_w in (round(0.8 * demand_w, 1), round(0.6 * demand_w, 1)):
        run.set_budget(budget_w)
        assert wait_for(lambda b=budget_w: held_everywhere(sims, b), 90.0) is not None  # type: ignore[misc]

    allocator = run.status().allocator
    assert allocator is not None
    writer = agents[allocator]._allocator._writer
    assert writer.transactions > writer.moves  # split moves
    assert writer.largest_txn_ops == ETCD_MAX_TXN_OPS  # as full as etcd takes
    # Only a node that won the election (a loaded machine may have let a lease lapse) read the whole pool.
    assert all(a._allocator.wins > 0 for a in agents.values() if a.full_reads > 0)
    assert sum(1 for a in agents.values() if a.full_reads > 0) < NODES // 10
    others = [a for n, a in agents.items() if n != allocator]
    assert sum(a._holder.pushed_applied for a in others) > 0  # grants arrived by the watch

    # Every node applies its lowered grant; the grants are not written again for it (a lowered grant names
    # the higher one until its next write), but the allocator's own is: its report vanishes with its role.
    def applied_everywhere() -> bool:
        view = run.view()
        return view.grants[allocator].held_w is None and all(
            g.held_w is None or (view.reports[n].report.applied_revision or 0) >= g.entry.mod_revision
            for n, g in view.grants.items()
        )

    assert wait_for(applied_everywhere, 60.0) is not None
    assert any(g.held_w is not None for g in run.view().grants.values())  # no rewrite of the others
    agents.pop(allocator).stop(revoke=False, uncap=False)  # as if killed: its lease expires
    killed = sims.pop(allocator)
    assert wait_for(lambda: allocator in run.reserved(), 60.0) is not None  # its grant stays, reserved
    assert run.reserved() == {allocator: killed.held}
    budget_w = round(0.7 * sum(s.demand_w for s in sims.values()), 1)
    run.set_budget(budget_w)
    reserved_w = killed.held or 0.0
    assert wait_for(lambda: held_everywhere(sims, budget_w, reserved_w), 90.0) is not None
    assert run.status().allocator not in (None, allocator)

    check = run.check_invariant(first, run.revision())
    assert check.violations == []
    assert check.grant_revisions >= 3

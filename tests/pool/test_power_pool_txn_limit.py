"""An etcd that takes few operations per transaction (`--max-txn-ops=16`) and a pool whose every move needs
several: the allocator sizes its transactions to what that etcd takes (etcd refuses a larger one, and the
pool would never move), fills them, and the grant invariant holds at every revision between them.

40 real `PoolAgent`s in this process (each with its own store, lease, watches and thread; a simulated node
behind each) on their own real 3-member etcd; etcd's default limit (128) is the 140-node test's
(`test_power_pool_many.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.pool.agent import PoolSettings
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.power_pool import PoolRun, fleet_nodes, held_everywhere, wait_for

pytestmark = [requires_etcd, pytest.mark.timeout(300)]

NODES, TTL_S, MAX_TXN_OPS = 40, 3, 16


@pytest.fixture
def small_txn_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path, flags=(f"--max-txn-ops={MAX_TXN_OPS}",))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def test_moves_split_to_what_etcd_takes_keep_the_invariant(small_txn_etcd: EtcdCluster) -> None:
    run = PoolRun(small_txn_etcd, "small", ttl_s=TTL_S)
    sims = fleet_nodes("n", NODES)
    settings = PoolSettings("small", etcd_max_txn_ops=MAX_TXN_OPS)
    try:
        with run.agents_in_process(sims, lambda _node: settings) as agents:
            assert wait_for(lambda: len(run.status().nodes) == NODES, 60.0) is not None
            first = run.revision()
            demand_w = sum(s.demand_w for s in sims.values())
            # Set (every grant raised from none), lowered, raised: each move of 40 grants takes 3-4
            # transactions.
            for budget_w in (round(0.8 * demand_w, 1), round(0.6 * demand_w, 1), round(0.9 * demand_w, 1)):
                run.set_budget(budget_w)
                assert wait_for(lambda b=budget_w: held_everywhere(sims, b), 90.0) is not None  # type: ignore[misc]

            writers = [a._allocator._writer for a in agents.values() if a._allocator._writer.moves > 0]
            assert writers  # (a loaded machine may have let the allocator's lease lapse: then two moved)
            assert sum(w.transactions for w in writers) >= 3 * sum(w.moves for w in writers) // 2
            assert max(w.largest_txn_ops for w in writers) == MAX_TXN_OPS  # as full as etcd takes
            assert sum(w.sent_at_once for w in writers) >= 3  # the middle parts of a move went together
            check = run.check_invariant(first, run.revision())
            assert check.violations == []
            assert check.raised_early == []
            assert check.grant_revisions >= 6
    finally:
        run.close()

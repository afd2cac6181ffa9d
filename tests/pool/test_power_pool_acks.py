"""Acknowledgements by revision, on a real 3-member etcd: a node reports a raised grant late (no etcd write
on the pool's critical path), so the allocator takes a lowered grant as applied only once the node's report
names the lowered grant's revision, never from the report's watts alone; and the allocator's own watches (a
budget requested, a report gone) follow the allocator role."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perseusd.pool.agent import PoolAgent, PoolSettings
from perseusd.pool.allocator import PoolAllocator
from perseusd.pool.keys import NodeReport
from perseusd.pool.view import PoolView
from tests.support.etcd_cluster import requires_etcd
from tests.support.power_pool import PoolRun, SimNode, wait_for

pytestmark = [requires_etcd, pytest.mark.timeout(300)]


def test_a_stale_report_never_acknowledges_a_later_lowered_grant(run: PoolRun) -> None:
    """n1 applied 300 W and reported it; it was raised to 800 W and, as a raise allows, did not report
    that yet; then lowered to 500 W. Its report (300 W) is below the new grant, but older than it: the
    others wait until n1 reports the lowered grant's revision (it may still hold 800 W)."""
    store, keys = run.store, run.keys
    leases = {node: store.grant_lease(30) for node in ("n1", "n2")}
    allocator_lease = store.grant_lease(30)
    allocator = PoolAllocator(store, keys, "n0", 30.0)

    def report(node: str, applied_w: float | None, revision: int | None) -> None:
        value = NodeReport(800, 200, {0: 600}, applied_w=applied_w, applied_revision=revision).encode()
        store.put(keys.node(node), value, leases[node])

    def rounds(count: int = 4) -> PoolView:
        for _ in range(count):
            allocator.round(run.view(), allocator_lease)
        return run.view()

    report("n1", None, None)
    run.set_budget(300)
    view = rounds()
    assert view.grants["n1"].grant_w == 300.0
    report("n1", 300.0, view.grants["n1"].entry.mod_revision)
    run.set_budget(1000)
    assert rounds().grants["n1"].grant_w == 800.0  # raised; n1 applies it without a report
    report("n2", None, None)  # joins: n1 is lowered to 500 W, n2 is to get 500 W once n1 applied it
    view = rounds()
    lowered = view.grants["n1"]
    assert (lowered.grant_w, lowered.held_w) == (500.0, 800.0)
    assert "n2" not in view.grants  # 300 W reported at an older revision is no acknowledgement
    report("n1", 500.0, lowered.entry.mod_revision)
    view = rounds()
    assert {n: g.grant_w for n, g in view.grants.items()} == {"n1": 500.0, "n2": 500.0}
    # n1's grant is not written again to drop the 800 W: its report names the lowered grant's revision...
    assert view.grants["n1"].entry.mod_revision == lowered.entry.mod_revision
    assert view.grants["n1"].held_w == 800.0
    # ... so a later lower carries its current grant (500 W) as the one it may still apply, not 800 W,
    report("n2", 500.0, view.grants["n2"].entry.mod_revision)
    run.set_budget(600)
    view = rounds()
    assert {n: (g.grant_w, g.held_w) for n, g in view.grants.items()} == {
        "n1": (300.0, 500.0),
        "n2": (300.0, 500.0),
    }
    # ... and that lower gates the next raise like any other: n2 applied 300 W, n1 says nothing yet.
    report("n2", 300.0, view.grants["n2"].entry.mod_revision)
    run.set_budget(1000)
    assert {n: g.grant_w for n, g in rounds().grants.items()} == {"n1": 300.0, "n2": 300.0}
    report("n1", 300.0, view.grants["n1"].entry.mod_revision)
    view = rounds()
    assert {n: (g.grant_w, g.held_w) for n, g in view.grants.items()} == {
        "n1": (500.0, None),
        "n2": (500.0, None),
    }
    for lease in (*leases.values(), allocator_lease):
        store.revoke(lease)


@pytest.fixture
def agents(run: PoolRun) -> Iterator[dict[str, PoolAgent]]:
    sims = {node: SimNode(800.0 + 100 * i, floor_w=200.0) for i, node in enumerate(("a", "b", "c", "d"))}
    with run.agents_in_process(sims, lambda _node: PoolSettings(run.pool)) as started:
        yield started


def test_raises_are_reported_late_and_lowers_by_revision(run: PoolRun, agents: dict[str, PoolAgent]) -> None:
    """Real agents: a budget raised and lowered; every node holds its grant, a raise's report is left to a
    later publication, a lowered grant's report names its revision, and at no revision did a grant rise
    while a lowered node had not reported applying its own."""
    assert wait_for(lambda: len(run.view().reports) == len(agents), 60.0) is not None
    first = run.revision()
    for budget_w in (1000.0, 2400.0, 1200.0, 2600.0):
        run.set_budget(budget_w)
        assert wait_for(run.settled(budget_w), 60.0) is not None, run.view()
    assert sum(a._membership.deferred_reports for a in agents.values()) > 0  # raises were reported late
    view = run.view()
    for node, report in view.reports.items():  # each report names the revision of the grant it applies
        grant = view.grants[node]
        assert report.report.applied_revision is not None
        assert report.report.applied_revision <= grant.entry.mod_revision
        if grant.held_w is not None:  # a lowered grant still naming the higher one: applied all the same
            assert report.report.applied_revision == grant.entry.mod_revision
    check = run.check_invariant(first, run.revision())
    assert check.violations == []
    assert check.raised_early == []

    # The allocator alone watches the budget request and reports vanishing; the role moves with it.
    allocator = run.status().allocator
    assert allocator is not None
    assert wait_for(lambda: len(agents[allocator]._watches.leader_watches) == 2, 30.0) is not None
    assert all(not a._watches.leader_watches for n, a in agents.items() if n != allocator)
    agents[allocator].stop()  # clean stop: the role goes to another node, which opens the watches
    rest = {n: a for n, a in agents.items() if n != allocator}
    assert wait_for(lambda: run.status().allocator in rest, 60.0) is not None
    successor = run.status().allocator
    assert successor is not None
    assert wait_for(lambda: len(rest[successor]._watches.leader_watches) == 2, 30.0) is not None
    run.set_budget(1500.0)
    assert wait_for(run.settled(1500.0), 60.0) is not None

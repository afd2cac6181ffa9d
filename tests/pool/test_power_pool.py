"""A cluster power pool on a real 3-member etcd with real daemons on simulated A100s (100-500 W limits):
budget changes, a node joining, a node SIGKILLed (its grant reserved until released), the allocator killed,
an impossible budget, quorum loss. `test_power_pool_absent.py` has the absent nodes' own tests.

Every test reads the pool at every etcd revision of its run afterwards and asserts the grant invariant (the
sum of the grants never exceeds the active budget). Timeouts are generous; what is asserted is what must
hold, never how fast a loaded machine got there.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from perseusd.pool.allocator import PoolAllocator
from perseusd.pool.keys import NodeReport
from perseusd.pool.view import PoolView, read_pool
from tests.pool.conftest import TTL_S
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess
from tests.support.power_pool import PoolRun, wait_for

pytestmark = [requires_etcd, pytest.mark.timeout(300)]

SETTLE_S = 30.0
MIN_W, MAX_W = 100.0, 500.0


def _settle(run: PoolRun, budget_w: float) -> None:
    if wait_for(run.settled(budget_w), SETTLE_S) is None:
        pytest.fail(f"pool never settled at {budget_w} W: {run.status()}")


def _grants(run: PoolRun) -> dict[str, float | None]:
    return {n.node: n.grant_w for n in run.status().nodes}


def _power_w(run: PoolRun, node: str) -> float:
    """The node's published measured power (W; -1 while it has not published one)."""
    power_w = next(n.power_w for n in run.status().nodes if n.node == node)
    return -1.0 if power_w is None else power_w


def _assert_invariant(run: PoolRun, first: int) -> None:
    check = run.check_invariant(first, run.revision())
    assert check.violations == []
    # Grants existed at more than one revision: the run really moved them (how many revisions depends on how
    # the joins and reports interleave, never fewer than two).
    assert check.grant_revisions >= 2


def test_budget_changes_join_kill_and_clear(run: PoolRun) -> None:
    first = run.revision()
    run.start_node("node-a")
    run.start_node("node-b")
    done = run.ctl("node-a", "cap-pool", "set", "--pool", run.pool, "--budget", "1000")
    assert done.returncode == 0, done.stderr
    assert "budget 1000.0 W requested (by root (uid 0) pid" in done.stdout
    _settle(run, 1000)
    assert _grants(run) == {"node-a": 500.0, "node-b": 500.0}
    shown = json.loads(run.ctl("node-b", "cap-pool", "status", "--pool", run.pool, "--json").stdout)
    assert shown["active_w"] == 1000.0
    assert shown["requested_by"].startswith("root (uid 0)")
    assert [(n["node"], n["grant_w"], n["applied_w"]) for n in shown["nodes"]] == [
        ("node-a", 500.0, 500.0),
        ("node-b", 500.0, 500.0),
    ]
    assert "budget set to 1000.0 W by root (uid 0)" in run.daemons["node-a"].log()
    assert wait_for(lambda: 0 < _power_w(run, "node-a") <= 500, SETTLE_S) is not None  # measured, idle GPUs
    run.move_gpu_limit("node-a", MAX_W)  # moved behind the pool's back: set again within a few rounds
    assert wait_for(lambda: run.gpu_limits_w("node-a") == pytest.approx(500, abs=0.5), SETTLE_S) is not None
    refused = run.ctl("node-a", "cap-pool", "set", "--pool", "no/slash", "--budget", "10")
    assert refused.returncode != 0
    assert "pool name" in refused.stderr + refused.stdout
    # The grant is enforced as uniform GPU power limits summing to it.
    assert run.gpu_limits_w("node-a") == pytest.approx(500, abs=0.5)

    run.set_budget(700)
    _settle(run, 700)
    assert _grants(run) == {"node-a": 350.0, "node-b": 350.0}
    run.set_budget(5000)  # more than the demand: each node gets its demand, no more
    _settle(run, 5000)
    assert _grants(run) == {"node-a": 2 * MAX_W, "node-b": 2 * MAX_W}

    run.set_budget(1500)
    run.start_node("node-c", gpus=3)  # joins: floor 300 W, demand 1500 W
    wait_for(lambda: len(run.status().nodes) == 3, SETTLE_S)
    _settle(run, 1500)
    grants = _grants(run)
    # Floors 700 W, then the 800 W left in proportion to what each asks above its floor (800, 800, 1200).
    assert grants == {"node-a": pytest.approx(428.5, abs=0.2), "node-b": pytest.approx(428.5, abs=0.2),
                      "node-c": pytest.approx(642.8, abs=0.2)}  # fmt: skip
    assert run.gpu_limits_w("node-c") == pytest.approx(grants["node-c"], abs=0.5)

    run.daemons["node-c"].kill()  # SIGKILL: its lease expires, its GPUs keep their limits: its grant stays
    assert wait_for(lambda: run.reserved() == {"node-c": grants["node-c"]}, SETTLE_S) is not None
    # The others keep their grants: re-allocated around the reservation as stored (642.8 W, rounded down to
    # 0.1 W like every grant), they may gain the 0.1 W the rounding left, never the dead node's share.
    assert {n: w for n, w in _grants(run).items() if n != "node-c"} == {
        "node-a": pytest.approx(grants["node-a"], abs=0.11),
        "node-b": pytest.approx(grants["node-b"], abs=0.11),
    }
    assert sum(w or 0.0 for w in _grants(run).values()) <= 1500
    released = run.ctl("node-a", "cap-pool", "release", "--pool", run.pool, "node-c")  # known gone
    assert released.returncode == 0, released.stderr
    redistributed = wait_for(lambda: _grants(run) == {"node-a": 750.0, "node-b": 750.0}, SETTLE_S)
    assert redistributed is not None, run.status()

    run.set_budget(150)  # below the floors (200 W): reported, never exceeded, GPUs at their minimum
    _settle(run, 150)
    status = run.status()
    assert status.problem is not None
    assert "below the sum of the nodes' floors" in status.problem
    assert status.granted_w <= 150
    assert run.gpu_limits_w("node-a") == 2 * MIN_W

    run.set_budget(None)  # no budget: grants withdrawn, the GPUs' own limits back
    assert wait_for(lambda: run.gpu_limits_w("node-b") == 2 * MAX_W, SETTLE_S) is not None
    assert all(n.grant_w is None for n in run.status().nodes)
    _assert_invariant(run, first)


def test_status_shows_the_pool_and_a_crash_leaves_no_uniform_limits(run: PoolRun) -> None:
    """`perseusctl status` shows the pool (text and JSON). A daemon SIGKILLed under a uniform grant leaves
    its GPUs capped; the next start, whatever its configuration (here: no pool at all), puts the original
    limits back from the state directory."""
    daemon = run.start_node("node-a")
    run.start_node("node-b")
    run.set_budget(500)
    _settle(run, 500)
    assert run.gpu_limits_w("node-a") == pytest.approx(250, abs=0.5)
    shown = json.loads(run.ctl("node-a", "status", "--json").stdout)["pool"]
    assert shown["pool"] == run.pool
    assert (shown["node"], shown["target"], shown["budget_w"], shown["grant_w"]) == (
        "node-a",
        "uniform",
        500,
        250,
    )
    assert (shown["applied_w"], shown["reason"]) == (250, "grant")
    text = run.ctl("node-a", "status").stdout
    assert f"power pool {run.pool} (node node-a, uniform" in text
    assert "budget 500.0 W, grant 250.0 W, holds 250.0 W (grant)" in text
    saved = daemon.dirs.state_dir / "pool-limits.json"
    assert json.loads(saved.read_text())["power_limits_w"] == dict.fromkeys(_uuids(daemon), MAX_W)

    daemon.kill()  # SIGKILL: nothing runs on the way out
    assert run.gpu_limits_w("node-a") == pytest.approx(250, abs=0.5)  # left capped by the dead daemon
    restarted = run.daemons["node-a"] = DaemonProcess(
        daemon.dirs, gpus=2, env={"PERSEUSD_JOB_CACHE": "false"}
    )
    restarted.start()
    assert run.gpu_limits_w("node-a") == 2 * MAX_W
    assert not saved.exists()
    assert "a previous daemon left pool power limits: restored" in restarted.log()
    assert json.loads(run.ctl("node-a", "status", "--json").stdout)["pool"] is None  # no pool now

    run.set_budget(None)  # node-b's clean stop: its limits back, its file gone
    assert wait_for(lambda: run.gpu_limits_w("node-b") == 2 * MAX_W, SETTLE_S) is not None
    assert wait_for(lambda: not (run.daemons["node-b"].dirs.state_dir / "pool-limits.json").exists(), 5)


def _uuids(daemon: DaemonProcess) -> list[str]:
    return [str(gpu["uuid"]) for gpu in daemon.status()["gpus"]]


def test_allocator_killed_another_takes_over(run: PoolRun) -> None:
    first = run.revision()
    for node in ("node-a", "node-b", "node-c"):
        run.start_node(node)
    run.set_budget(900)
    _settle(run, 900)
    allocator = run.status().allocator
    assert allocator in run.daemons
    run.daemons[allocator].signal(signal.SIGKILL)
    run.daemons[allocator].wait()
    taken = wait_for(lambda: run.status().allocator not in (None, allocator), SETTLE_S)
    assert taken is not None
    survivors = sorted(n for n in run.daemons if n != allocator)
    # The dead node's grant stays reserved (its GPUs keep their limits) until an admin releases it; then
    # its share goes to the two others (each at most its 1000 W demand), then a new budget.
    assert wait_for(lambda: run.reserved() == {allocator: 300.0}, SETTLE_S) is not None
    assert {n: g for n, g in _grants(run).items() if n != allocator} == dict.fromkeys(survivors, 300.0)
    assert run.release(allocator) == 300.0
    assert wait_for(lambda: _grants(run) == dict.fromkeys(survivors, 450.0), SETTLE_S) is not None
    run.set_budget(600)
    _settle(run, 600)
    assert _grants(run) == dict.fromkeys(survivors, 300.0)
    leaving, staying = survivors
    run.daemons[leaving].stop()  # SIGTERM: report and grant deleted, limits put back, its share to the other
    assert run.gpu_limits_w(leaving) == 2 * MAX_W
    assert wait_for(lambda: _grants(run) == {staying: 600.0}, SETTLE_S) is not None
    _assert_invariant(run, first)


def test_quorum_loss_keeps_the_grant_then_the_safe_cap(run: PoolRun, etcd: EtcdCluster) -> None:
    first = run.revision()
    run.start_node("node-a", safe_cap_w=300)  # below its grant: falls to 300 W
    run.start_node("node-b", safe_cap_w=0)  # 0: its floor (200 W)
    run.start_node("node-c", safe_cap_w=5000)  # above its grant: never above the last grant
    run.set_budget(1500)
    _settle(run, 1500)
    assert _grants(run) == dict.fromkeys(run.daemons, 500.0)

    lost_at_s = time.monotonic()
    etcd.kill_quorum()
    limits = {node: run.gpu_limits_w(node) for node in run.daemons}
    if time.monotonic() - lost_at_s < TTL_S / 2:  # checked early enough to be within the lease's life
        assert limits == dict.fromkeys(run.daemons, 500.0)
    fallback = {"node-a": 300.0, "node-b": 2 * MIN_W, "node-c": 500.0}
    reached = wait_for(lambda: {n: run.gpu_limits_w(n) for n in run.daemons} == fallback, SETTLE_S)
    assert reached is not None, {n: run.gpu_limits_w(n) for n in run.daemons}
    assert time.monotonic() - lost_at_s >= TTL_S * 2 / 3  # not before the lease would have expired (its
    # last renewal was at most a third of the TTL before etcd went)

    etcd.restart()  # back: new leases, new grants
    _settle(run, 1500)
    assert _grants(run) == dict.fromkeys(run.daemons, 500.0)
    _assert_invariant(run, first)


def test_the_node_cap_holds_a_pool_grant(run: PoolRun) -> None:
    """With the default target the grant goes to the node cap (docs/power-caps.md): `cap status` shows it,
    the idle GPUs' limits sum to at most the grant, and a withdrawn grant gives the limits back."""
    first = run.revision()
    run.start_node("node-a", target="frontier")
    run.start_node("node-b", target="frontier")
    run.set_budget(1000)
    _settle(run, 1000)
    assert _grants(run) == {"node-a": 500.0, "node-b": 500.0}

    def cap_status(node: str) -> dict[str, Any]:
        shown = run.ctl(node, "cap", "status", "--json")
        assert shown.returncode == 0, shown.stderr
        result: dict[str, Any] = json.loads(shown.stdout)
        return result

    for node in ("node-a", "node-b"):
        assert wait_for(lambda n=node: cap_status(n)["pool_grant_w"] == 500.0, SETTLE_S) is not None  # type: ignore[misc]
        status = cap_status(node)
        assert status["grant_w"] == 500.0
        assert status["feasible"] is True
        held = wait_for(lambda n=node: 2 * MIN_W <= run.gpu_limits_w(n) <= 500.0 + 0.5, SETTLE_S)  # type: ignore[misc]
        assert held is not None, run.gpu_limits_w(node)

    run.daemons["node-a"].stop()  # SIGTERM: lease revoked, limits put back, its share to node-b
    assert run.gpu_limits_w("node-a") == 2 * MAX_W
    assert wait_for(lambda: _grants(run) == {"node-b": 2 * MAX_W}, SETTLE_S) is not None
    run.set_budget(None)
    assert wait_for(lambda: run.gpu_limits_w("node-b") == 2 * MAX_W, SETTLE_S) is not None
    assert wait_for(lambda: cap_status("node-b")["grant_w"] is None, SETTLE_S) is not None
    _assert_invariant(run, first)


def test_a_stale_allocator_cannot_write(run: PoolRun) -> None:
    """An allocator whose lease is gone (cut off, replaced) fails its transactions, even from a view in
    which it was the allocator."""
    store, keys = run.store, run.keys
    node_lease = store.grant_lease(30)
    store.put(keys.node("n1"), NodeReport(800, 200, {0: 600}).encode(), node_lease)
    run.set_budget(600)
    old_lease, new_lease = store.grant_lease(30), store.grant_lease(30)
    old, new = PoolAllocator(store, keys, "old", 3.0), PoolAllocator(store, keys, "new", 3.0)

    def view() -> PoolView:
        return read_pool(keys, *store.range_prefix(keys.root))

    old.round(view(), old_lease)  # wins the election
    stale_view = view()
    assert stale_view.allocator_node == "old"
    store.revoke(old_lease)  # its key goes with its lease
    new.round(view(), new_lease)  # wins
    assert view().allocator_node == "new"
    old.round(stale_view, old_lease)  # acts on its old view: refused by etcd
    assert old._writer.moves == 0
    assert view().grants == {}
    new.round(view(), new_lease)  # nothing to lower: the active budget and the grant in one move
    new.round(view(), new_lease)  # nothing left to move
    assert {n: g.grant_w for n, g in view().grants.items()} == {"n1": 600.0}
    # A node whose lease expires between the allocator's read and its write: every write holds only on the
    # reports it read, so the move is refused whole and read again.
    other_lease = store.grant_lease(30)
    store.put(keys.node("n2"), NodeReport(800, 200, {0: 600}).encode(), other_lease)
    before_gone = view()
    store.revoke(node_lease)  # n1's report goes; its grant stays (its GPUs may still draw it)
    moves = new._writer.moves
    new.round(before_gone, new_lease)  # would lower n1 to 300 W, from a view in which it reports
    assert new._writer.moves == moves
    assert {n: g.grant_w for n, g in view().grants.items()} == {"n1": 600.0}
    for _ in range(3):
        new.round(view(), new_lease)  # n1 absent: its grant kept, marked; nothing left for n2
    assert view().grants["n1"].absent_since_s is not None
    assert new.last_allocation is not None
    assert new.last_allocation.reserved_w == 600.0
    assert view().granted_w <= 600.0
    assert run.release("n1") == 600.0  # an admin: n1 is gone
    for _ in range(3):
        new.round(view(), new_lease)  # n2 alone: granted all it asks up to the budget
    assert {n: g.grant_w for n, g in view().grants.items()} == {"n2": 600.0}
    # A raise for a node whose report is gone since the read: refused whole.
    third_lease = store.grant_lease(30)
    store.put(keys.node("n3"), NodeReport(800, 200, {0: 600}).encode(), third_lease)
    run.set_budget(2000)
    before_gone = view()
    store.revoke(third_lease)
    moves = new._writer.moves
    # Nothing to lower: the active budget and the raises in one move, n2 to 800 W and n3 to 800 W though
    # n3's report is gone: refused whole (the active budget too).
    new.round(before_gone, new_lease)
    assert new._writer.moves == moves
    assert {n: g.grant_w for n, g in view().grants.items()} == {"n2": 600.0}
    active = view().active
    assert active is not None
    assert active.budget_w == 600.0
    for lease in (other_lease, new_lease):
        store.revoke(lease)


def test_a_second_daemon_with_the_same_node_name_takes_no_share(run: PoolRun) -> None:
    """Two daemons with one node name: the second finds the name held under another lease, says so in
    its log and status, and holds its safe cap (its floor) instead of a share of the budget."""
    run.start_node("node-a")
    run.daemons["node-a-twin"] = DaemonProcess(DaemonDirs.create(), gpus=2, env=run.env("node-a"))
    twin = run.daemons["node-a-twin"].start()
    run.set_budget(1000)
    _settle(run, 1000)
    taken = wait_for(
        lambda: "node name node-a is held in the pool under another lease" in twin.log(), SETTLE_S
    )
    assert taken is not None, twin.log()
    assert [n.node for n in run.status().nodes] == ["node-a"]  # one report, one grant
    assert run.gpu_limits_w("node-a") == pytest.approx(1000, abs=0.5)
    assert wait_for(lambda: run.gpu_limits_w("node-a-twin") == 2 * MIN_W, SETTLE_S) is not None
    shown = run.ctl("node-a-twin", "status").stdout
    assert "node name node-a is held" in shown, shown

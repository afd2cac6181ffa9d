"""The pool's allocation (floors, tiers, proportional, demand-bounded) and its two-step moves."""

from __future__ import annotations

import random

import pytest

from perseusd.cluster.etcd_store import Entry
from perseusd.gpu.backend import GpuInfo
from perseusd.pool.agent import PoolSettings
from perseusd.pool.alloc import NodeNeed, allocate, plan_moves
from perseusd.pool.keys import GrantRecord, NodeReport, PoolKeys, decode_grant_record
from perseusd.pool.move_writer import ETCD_MAX_TXN_OPS, MAX_TXN_OPS, MIN_TXN_OPS, send_order, txn_parts
from perseusd.pool.uniform import uniform_limits_w
from perseusd.pool.view import Grant, Report, read_pool


def test_floors_first_then_higher_tiers_then_proportional() -> None:
    needs = [
        NodeNeed("a", demand_w=1000, floor_w=400, priority_w={2: 200, 0: 400}),
        NodeNeed("b", demand_w=800, floor_w=300, priority_w={2: 100, 1: 400}),
    ]
    # floors 700; tier 2 asks 300 -> all; 150 left for tier 1 (b asks 400).
    allocation = allocate(1150, needs)
    assert allocation.feasible
    assert allocation.grants_w == {"a": 600.0, "b": 550.0}
    # Tier 1 fully served (400), tier 0 gets 100 of a's 400.
    assert allocate(1500, needs).grants_w == {"a": 700.0, "b": 800.0}


def test_never_above_demand_and_leftover_kept_back() -> None:
    needs = [NodeNeed("a", 500, 100), NodeNeed("b", 300, 100)]
    allocation = allocate(10_000, needs)
    assert allocation.grants_w == {"a": 500.0, "b": 300.0}


def test_impossible_budget_is_reported_and_still_never_exceeded() -> None:
    needs = [NodeNeed("a", 500, 300), NodeNeed("b", 500, 300)]
    allocation = allocate(450, needs)
    assert not allocation.feasible
    assert allocation.problem is not None
    assert "below the sum of the nodes' floors 600.0 W" in allocation.problem
    assert sum(allocation.grants_w.values()) <= 450
    assert allocation.grants_w == {"a": 225.0, "b": 225.0}


def test_bad_needs_are_refused() -> None:
    with pytest.raises(ValueError, match="above demand"):
        NodeNeed("a", 100, 200)
    with pytest.raises(ValueError, match="finite"):
        NodeNeed("a", float("nan"), 0)
    with pytest.raises(ValueError, match="budget"):
        allocate(-1, [])


def test_random_pools_sum_within_budget_and_moves_keep_it_between_steps() -> None:
    rng = random.Random(7)
    for _ in range(500):
        needs = []
        for i in range(rng.randint(1, 8)):
            floor_w = rng.uniform(0, 800)
            demand_w = floor_w + rng.uniform(0, 2000)
            tiers = {t: rng.uniform(0, 600) for t in range(3) if rng.random() < 0.6}
            needs.append(NodeNeed(f"n{i}", demand_w, floor_w, tiers))
        old = allocate(rng.uniform(0, 12_000), needs).grants_w
        new_budget_w = rng.uniform(0, 12_000)
        new = allocate(new_budget_w, needs)
        assert sum(new.grants_w.values()) <= new_budget_w + 1e-6
        for need in needs:
            assert new.grants_w[need.node] <= need.demand_w + 1e-9
            if new.feasible:
                assert new.grants_w[need.node] >= need.floor_w - 0.1 - 1e-9
        moves = plan_moves(old, new.grants_w)
        between = {**old, **moves.lowers}
        assert all(between[n] <= new.grants_w[n] + 1e-9 for n in between)
        assert sum(between.values()) <= new_budget_w + 1e-6
        assert {**between, **moves.raises} == new.grants_w


def test_moves_drop_departed_nodes_and_raise_new_ones() -> None:
    moves = plan_moves({"a": 300, "gone": 200}, {"a": 250, "new": 100})
    assert moves.lowers == {"a": 250}
    assert moves.drops == ("gone",)
    assert moves.raises == {"new": 100}


def _gpu(uuid: str, min_w: float, max_w: float) -> GpuInfo:
    return GpuInfo(uuid, 0, "sim", "0", (1410,), min_w, max_w, max_w, True)


def test_uniform_limits_sum_to_the_grant_within_constraints() -> None:
    gpus = [_gpu("g0", 100, 400), _gpu("g1", 100, 250), _gpu("g2", 150, 400)]
    limits = uniform_limits_w(900, gpus)
    assert sum(limits.values()) == pytest.approx(900, abs=1e-6)
    assert sum(limits.values()) <= 900
    assert limits["g1"] == 250  # at its maximum; the others share the rest alike
    assert limits["g0"] == pytest.approx(325)
    assert limits["g2"] == pytest.approx(325)
    assert uniform_limits_w(100, gpus) == {"g0": 100, "g1": 100, "g2": 150}  # impossible: the minimums
    assert uniform_limits_w(5000, gpus) == {"g0": 400, "g1": 250, "g2": 400}


def test_absent_nodes_reservations_come_off_the_budget() -> None:
    needs = [NodeNeed("a", 1000, 200), NodeNeed("b", 1000, 200)]
    allocation = allocate(1200, needs, reserved_w=400)  # an absent node may still draw 400 W
    assert allocation.grants_w == {"a": 400.0, "b": 400.0}
    assert sum(allocation.grants_w.values()) + 400 <= 1200
    short = allocate(600, needs, reserved_w=400)  # 200 W left for 400 W of floors
    assert sum(short.grants_w.values()) <= 200
    assert short.problem is not None
    assert "less 400.0 W reserved for absent nodes" in short.problem
    with pytest.raises(ValueError, match="reserved"):
        allocate(1200, needs, reserved_w=float("nan"))


def test_a_grant_record_reserves_the_higher_grant_not_yet_applied() -> None:
    lowered = GrantRecord(300.0, held_w=500.0)
    assert lowered.reserved_w == 500.0
    decoded = decode_grant_record(GrantRecord(300.0, 500.0, 1767225600.0).encode().encode())
    assert decoded == GrantRecord(300.0, 500.0, 1767225600.0)
    assert decode_grant_record(b'{"grant_w": 300}') == GrantRecord(300.0)  # as older versions wrote it
    assert "held_w" not in GrantRecord(300.0, held_w=200.0).encode()  # not higher: nothing to hold
    with pytest.raises(ValueError, match="grant_w"):
        decode_grant_record(b'{"held_w": 5}')


def test_allocator_transactions_as_large_as_etcd_takes() -> None:
    """A move's transactions never carry more comparisons or writes than etcd's `--max-txn-ops`, and as few
    as that allows: each part as full as its guards and fixed writes leave room for (the final one less)."""
    for max_ops in (MIN_TXN_OPS, 9, 16, ETCD_MAX_TXN_OPS, MAX_TXN_OPS):
        for grants in (*range(0, 3 * max_ops), 1024, 5000):
            for compares in ((2, 2), (3, 3), (2, 3)):
                for first_writes, last_writes in ((0, 0), (0, 1), (1, 0), (1, 1)):
                    sizes = txn_parts(grants, max_ops, compares, first_writes, last_writes)
                    assert sum(sizes) == grants
                    fixed_compares = [compares[0]] + [compares[1]] * (len(sizes) - 1)
                    fixed_writes = [first_writes] + [0] * (len(sizes) - 1)
                    fixed_writes[-1] += last_writes
                    for size, compare, write in zip(sizes, fixed_compares, fixed_writes, strict=True):
                        assert size + max(compare, write) <= max_ops
                    # Every part but the last two is full; one part fewer could not hold them all.
                    for size, compare, write in list(zip(sizes, fixed_compares, fixed_writes, strict=True))[
                        :-2
                    ]:
                        assert size == max_ops - max(compare, write)
                    room = max_ops - max(compares[0], compares[1], first_writes + last_writes)
                    assert len(sizes) <= max(1, -(-grants // room))
    # 1,024 nodes at etcd's default: 9 transactions (126 grants and the two guards each), not 11 of 100.
    assert txn_parts(1024, ETCD_MAX_TXN_OPS, (2, 2), 0, 1) == [126] * 8 + [16]
    with pytest.raises(ValueError, match="holds no grant"):
        txn_parts(5, 3, (3, 3), 1, 1)
    with pytest.raises(ValueError, match="max operations per transaction"):
        PoolSettings("p", etcd_max_txn_ops=MIN_TXN_OPS - 1)


def test_parts_sent_together_never_include_the_active_budget_write() -> None:
    """A lower's active budget changes after every lowered part has landed, a raise's before any raised
    part: only the parts in between go to etcd together; without `at_once`, one after another."""
    assert send_order(9, first=False, last=True, at_once=True) == [list(range(8)), [8]]
    assert send_order(9, first=True, last=False, at_once=True) == [[0], list(range(1, 9))]
    assert send_order(9, first=False, last=False, at_once=True) == [list(range(9))]
    assert send_order(9, first=False, last=True, at_once=False) == [[i] for i in range(9)]
    assert send_order(2, first=False, last=True, at_once=True) == [[0], [1]]  # nothing to send together
    for parts in range(1, 12):
        for first in (False, True):
            for last in (False, True):
                order = send_order(parts, first, last, True)
                assert sorted(i for batch in order for i in batch) == list(range(parts))
                if first:
                    assert order[0] == [0]
                if last:
                    assert order[-1] == [parts - 1]


def test_a_read_decodes_only_what_changed_since_the_last() -> None:
    """The allocator's read of a thousand reports every round: an entry of the same key and modification
    revision is taken as decoded before, one written since (or written again after a deletion) decoded
    anew, and a key gone leaves the view and the cache."""
    keys = PoolKeys("/p", "pool")

    def report(applied_w: float, mod_revision: int, node: str = "n1") -> Entry:
        value = NodeReport(800, 200, applied_w=applied_w).encode().encode()
        return Entry(keys.node(node), value, 2, mod_revision, 7)

    grant = Entry(keys.grant("n1"), GrantRecord(300.0, 500.0).encode().encode(), 3, 3, 0)
    decoded: dict[str, Report | Grant] = {}
    first = read_pool(keys, 5, [report(300.0, 4), report(100.0, 4, "n2"), grant], decoded)
    assert set(decoded) == {keys.node("n1"), keys.node("n2"), keys.grant("n1")}
    again = read_pool(keys, 6, [report(300.0, 4), grant], decoded)
    assert again.reports["n1"] is first.reports["n1"]
    assert again.grants["n1"] is first.grants["n1"]
    assert "n2" not in again.reports
    assert keys.node("n2") not in decoded
    changed = read_pool(keys, 8, [report(500.0, 8), grant], decoded)
    assert changed.reports["n1"].report.applied_w == 500.0
    assert changed == read_pool(keys, 8, [report(500.0, 8), grant])  # as a read without the cache

"""A pool's budget from a facility controller's file: parsing, staleness, and the fallback on a real etcd.

Three real `PoolAgent`s in this process (simulated nodes), one of them reading the budget file. The file's
budget becomes the pool's; when the controller stops rewriting it, the grants are held for the hold time,
then deleted (every node at its safe cap, the active budget kept); a fresh signal brings grants back. The
invariant is checked at every etcd revision of the run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.pool.agent import PoolAgent, PoolSettings
from perseusd.pool.feed import BudgetFile, FeedSettings, parse_signal
from perseusd.pool.keys import FRESH, HOLDING, LAPSED, Budget, decode_budget
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.power_pool import FLOOR_W, PoolRun, SimNode, fleet_nodes, wait_for

MAX_AGE_S, HOLD_S, TTL_S = 3.0, 3.0, 3


def test_signal_file_formats_and_errors(tmp_path: Path) -> None:
    assert parse_signal('{"budget_w": 24000, "source": "dr-17", "at_s": 5}', 9.0, "f") == (
        24000.0,
        "dr-17",
        5.0,
    )
    assert parse_signal("1500.5", 9.0, "f") == (1500.5, "facility", 9.0)
    for bad in ("", "[1]", '{"budget_w": -1}', '{"budget_w": "x"}', '{"budget_w": 1, "at_s": true}', "NaN"):
        with pytest.raises(ValueError, match="budget file f"):
            parse_signal(bad, 9.0, "f")
    path = tmp_path / "budget.json"
    feed = BudgetFile(FeedSettings(path, MAX_AGE_S, HOLD_S))
    assert feed.read() is None  # no file yet
    path.write_text('{"budget_w": 900, "source": "dcim"}')
    budget = feed.read()
    assert budget is not None
    assert budget.budget_w == 900
    assert budget.by == f"dcim (file {path})"
    assert budget.at_s == pytest.approx(path.stat().st_mtime)
    assert decode_budget(budget.encode().encode()) == budget  # what etcd holds reads back the same
    path.write_text("oops")
    with pytest.raises(ValueError, match="not JSON"):
        feed.read()
    with pytest.raises(ValueError, match="max age"):
        FeedSettings(path, 0.0, HOLD_S)


def test_budget_freshness() -> None:
    budget = Budget(100.0, "x", at_s=1000.0, max_age_s=10.0, hold_s=5.0)
    assert [budget.freshness(t) for t in (1005.0, 1012.0, 1016.0)] == [FRESH, HOLDING, LAPSED]
    assert Budget(100.0, "admin", at_s=0.0).freshness(1e9) == FRESH  # an admin's budget never ages


@pytest.fixture
def pool(
    etcd: EtcdCluster, tmp_path: Path
) -> Iterator[tuple[PoolRun, dict[str, PoolAgent], dict[str, SimNode], Path]]:
    etcd.restart()
    run = PoolRun(etcd, "feed", ttl_s=TTL_S)
    path = tmp_path / "budget.json"
    sims = fleet_nodes("f", 3)

    def settings(node: str) -> PoolSettings:
        """Node f0 reads the budget file; the others follow the pool."""
        return PoolSettings("feed", 0.0, str(path) if node == "f0" else "", MAX_AGE_S, HOLD_S)

    try:
        with run.agents_in_process(sims, settings, refresh_interval_s=0.2) as agents:
            yield run, agents, sims, path
    finally:
        run.close()


@requires_etcd
@pytest.mark.timeout(180)
def test_a_stale_signal_holds_the_grants_then_the_safe_caps(
    pool: tuple[PoolRun, dict[str, PoolAgent], dict[str, SimNode], Path],
) -> None:
    run, agents, sims, path = pool
    assert wait_for(lambda: len(run.status().nodes) == 3, 30.0) is not None
    first = run.revision()
    budget_w = 0.7 * sum(s.demand_w for s in sims.values())
    _signal(path, budget_w)
    assert wait_for(lambda: run.status().active_w == budget_w and _all_granted(sims), 30.0) is not None
    assert wait_for(lambda: agents["f2"].status().budget_by is not None, 10.0) is not None
    status = agents["f2"].status()
    assert status.budget_by is not None
    assert "file" in status.budget_by
    assert status.budget_signal == FRESH
    held = {n: s.held for n, s in sims.items()}

    # The controller stops: grants held while the signal is stale within the hold time ...
    assert wait_for(lambda: run.status().signal == HOLDING, MAX_AGE_S + 5.0) is not None
    assert {n: s.held for n, s in sims.items()} == held
    assert all(n.grant_w is not None for n in run.status().nodes)
    # ... then deleted: every node at its safe cap (its floor here), the pool still capped.
    assert wait_for(lambda: all(s.held == FLOOR_W for s in sims.values()), HOLD_S + 10.0) is not None
    status_reply = run.status()
    assert status_reply.signal == LAPSED
    assert status_reply.active_w == budget_w
    assert all(n.grant_w is None for n in status_reply.nodes)
    assert "safe cap" in agents["f1"].status().reason

    # A fresh signal: grants again.
    _signal(path, budget_w - 100.0)
    assert (
        wait_for(lambda: run.status().active_w == budget_w - 100.0 and _all_granted(sims), 30.0) is not None
    )
    check = run.check_invariant(first, run.revision())
    assert check.violations == []


def _signal(path: Path, budget_w: float) -> None:
    """Write the signal as a controller would: a new file renamed over the old one."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"budget_w": budget_w, "source": "dr-test", "at_s": time.time()}))
    os.replace(scratch, path)


def _all_granted(sims: dict[str, SimNode]) -> bool:
    return all(s.held is not None and s.held > FLOOR_W for s in sims.values())


def test_status_lines_show_the_budget_source_age_and_state() -> None:
    from perseus_client.pool_messages import PoolStatusReply
    from perseus_client.status_messages import PoolInfo

    from perseusd.ctl.cap_pool_cmd import format_pool_status
    from perseusd.ctl.status_cmd import pool_line

    info = PoolInfo(
        "row-3", "n1", "frontier", 900.0, 300.0, 300.0, "grant", False, None, "dr-7 (file f)", 75.0, HOLDING
    )
    assert "budget from dr-7 (file f), 0h01m15s old, stale: last grants held" in pool_line(info)
    admin = PoolInfo(
        "row-3", "n1", "frontier", 900.0, 300.0, 300.0, "grant", False, None, "admin", 5.0, FRESH
    )
    assert FRESH not in pool_line(admin)
    reply = PoolStatusReply("row-3", 7, 900.0, "dr-7 (file f)", 900.0, 0.0, "n1", None, (), 400.0, LAPSED)
    assert "by dr-7 (file f) 400 s ago (stale: safe caps)" in format_pool_status(reply)


def test_pool_metrics_show_the_budget_age_and_signal_state() -> None:
    from perseus_client.status_messages import PoolInfo

    from perseusd.metrics.pool_metrics import pool_families

    info = PoolInfo(
        "row-3", "n1", "frontier", 900.0, 300.0, 300.0, "grant", False, None, "dr-7 (file f)", 75.0, LAPSED
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in pool_families(info)
        for s in family.samples
    }
    assert samples[("perseus_power_pool_budget_watts", (("pool", "row-3"),))] == 900.0
    assert (
        samples[("perseus_power_pool_budget_age_seconds", (("pool", "row-3"), ("source", "dr-7 (file f)")))]
        == 75.0
    )
    assert samples[("perseus_power_pool_budget_signal", (("pool", "row-3"), ("state", LAPSED)))] == 1.0
    assert samples[("perseus_power_pool_budget_signal", (("pool", "row-3"), ("state", FRESH)))] == 0.0

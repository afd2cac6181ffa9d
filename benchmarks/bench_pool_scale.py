"""A power pool at fleet scale: N real pool agents (many per process) on a real 3-member etcd on loopback.

For each N, a fresh etcd (3 members, loopback, `tests/support/etcd_cluster.py`) and N agents
(`benchmarks/pool_scale_worker.py`: the real `PoolAgent`, each with its own store, lease, watches and thread;
8 simulated GPUs of 100-400 W behind each). The allocator is the first node, alone in its process. Measured:

- budget changes (seeded, between the floors and the demand): for every node whose grant changed, the time
  from the admin's write to the node applying its new grant (p50, p99, max);
- etcd in steady state (no change for `--hold` s): revisions/s (every write, lease expiries included) and
  raft proposals/s, the CPU of the etcd members and of the agents' processes;
- a node hung (it stops renewing its lease): the time until every other node holds the share it got back
  (run with `power_pool_absent_node = "release"`, `--absent-node`, the default here: with "hold", the
  default of the daemon, the share stays reserved until an admin releases it, docs/power-pool.md);
- the allocator's process SIGKILLed just after its first transaction of a budget change (mid-move): the time
  until every node holds its grant under the new allocator;
- the allocator's CPU per round, the largest request and the largest reply any agent handled;
- etcd's database: size at the end, after compaction and defragmentation, and the history an hour of the
  measured write rate adds (what `--auto-compaction-retention=1h` keeps at most);
- the invariant, from one watch on the pool replaying every event from the first revision: at every
  revision the sum of the grants is at most the active budget, and no grant is raised while a node whose
  grant was lowered still applies more than its grant (its report's watts above it, or its report older
  than the lowered grant's revision);
- where each budget change's time went (`phases`, from the arrival times of that watch's events): the first
  and last lowering transaction, the last report before the first raise, the first and last raising
  transaction, every node holding its grant, and the reports written meanwhile; the same for the hung node;
  and the allocator's own calls (its reads of the pool and its transactions: start after the set, seconds,
  entries or writes), with the CPU of the allocator's process, the agents', etcd's and this one's while the
  budget changes run (`cpu_cores_during_changes`).

Agents are packed `--per-process` to a process in the order of their names (`--interleave`: dealt round
robin); `--serial-parts` has the allocator send every part of a move after the one before, for comparison.

Baseline in the same run: an etcd write read back by another client (one key, polled at 10 ms).
Prints one JSON object.

This module runs the measurements for each N and prints them; the parts: the worker processes
(`pool_scale_process.py`, each running `pool_scale_worker.py`), the fleet of them on one etcd
(`pool_scale_fleet.py`), the invariant watch (`pool_scale_invariant.py`), the budget changes and their
phases (`pool_scale_changes.py`), the hung node and the killed allocator (`pool_scale_failures.py`), etcd's
baseline, steady state and database (`pool_scale_etcd.py`), and the straggler plane (`pool_scale_plane.py`).

    flock /tmp/perseus-bench.lock python benchmarks/bench_pool_scale.py --nodes 16,128,512,1024
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.pool_options import add_pool_options  # noqa: E402
from benchmarks.pool_scale_changes import budget_changes, cpu_during_changes, phases  # noqa: E402
from benchmarks.pool_scale_etcd import database, read_back_baseline, steady_state  # noqa: E402
from benchmarks.pool_scale_failures import kill_allocator, kill_node  # noqa: E402
from benchmarks.pool_scale_fleet import Fleet  # noqa: E402
from benchmarks.pool_scale_plane import run_plane  # noqa: E402
from benchmarks.pool_scale_summary import percentile, summary  # noqa: E402
from tests.support.etcd_cluster import EtcdCluster  # noqa: E402


def run_one(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed + nodes)
    with tempfile.TemporaryDirectory(prefix="pool-scale-") as base:
        etcd = EtcdCluster(Path(base))
        etcd.start()
        fleet = None
        try:
            result: dict[str, Any] = {"nodes": nodes, "load_at_start": os.getloadavg()[0]}
            result["baseline_write_read_back"] = read_back_baseline(etcd)
            started = time.monotonic()
            result["absent_node_policy"] = args.absent_node
            fleet = Fleet(
                etcd,
                nodes,
                args.per_process,
                args.ttl,
                args.interval,
                args.absent_node,
                args.interleave,
                args.serial_parts,
            )
            result["serial_parts"] = args.serial_parts
            result["packing"] = "interleaved" if args.interleave else "consecutive"
            result["start_s"] = round(time.monotonic() - started, 1)
            latencies, per_change = budget_changes(fleet, args.changes, rng)
            result["budget_change_held"] = summary(latencies) | {
                "changes": args.changes,
                "per_change_max_s": [round(x, 3) for x in per_change],
                "phases": list(phases),
                "cpu_cores_during_changes": dict(cpu_during_changes),
            }
            steady = steady_state(fleet, args.hold)
            result["steady_state"] = steady
            result["node_death"] = kill_node(fleet)
            stats: dict[str, Any] = {}
            for worker in fleet.workers:
                stats |= worker.get_stats()
            cpu = [c for s in stats.values() for c in s["allocator_cpu_s"]]
            result["allocator_cpu_per_round_s"] = {
                "rounds": len(cpu),
                "p50": percentile(cpu, 0.5),
                "max": None if not cpu else round(max(cpu), 4),
            }
            result["largest_request_kib"] = round(
                max(s["largest_request_b"] for s in stats.values()) / 1024, 1
            )
            result["largest_reply_kib"] = round(max(s["largest_reply_b"] for s in stats.values()) / 1024, 1)
            result["allocator_death_mid_move"] = kill_allocator(fleet)
            time.sleep(1.0)
            inv = fleet.invariant
            result["invariant"] = {
                "revisions": inv.revisions,
                "revisions_with_grants": inv.grant_revisions,
                "violations": len(inv.violations),
                "first_violations": inv.violations[:3],
                "raised_before_lowered_applied": len(inv.raise_violations),
                "first_raise_violations": inv.raise_violations[:3],
                "max_grants_over_budget": round(inv.max_ratio, 4),
            }
            result["database"] = database(fleet, steady["revisions_per_s"])
            result["load_at_end"] = os.getloadavg()[0]
            return result
        finally:
            if fleet is not None:
                fleet.close()
            etcd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="16,128,512,1024")
    parser.add_argument("--per-process", type=int, default=128)
    add_pool_options(
        parser,
        changes=5,
        ttl=10,
        interval_s=0.5,
        absent_node_help="every agent's power_pool_absent_node (release: a hung node's share is timed coming "
        "back)",
    )
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="deal nodes to processes round robin, node i to process i %% P (default: consecutive names, as "
        "the allocator writes them, to one process)",
    )
    parser.add_argument(
        "--serial-parts",
        action="store_true",
        help="the allocator sends every part of a move after the one before (default: the parts that may "
        "land in any order at once)",
    )
    parser.add_argument(
        "--plane", action="store_true", help="measure the straggler plane instead of the pool"
    )
    parser.add_argument("--job-size", type=int, default=16, help="with --plane: pipelines (nodes) per job")
    parser.add_argument("--announcements", type=int, default=5, help="with --plane: jobs announcing one")
    args = parser.parse_args()
    results = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        try:
            results.append(run_plane(nodes, args) if args.plane else run_one(nodes, args))
        except Exception as exc:
            results.append({"nodes": nodes, "failed": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"settings": vars(args), "cpus": os.cpu_count(), "runs": results}, indent=2))


if __name__ == "__main__":
    main()

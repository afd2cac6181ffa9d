"""One process of `bench_pool_scale.py`: many pool agents (the real `PoolAgent`), simulated GPUs behind each.

Each agent has its own etcd store (its own HTTP sessions), lease, watches and thread, as a daemon would.
Every grant an agent applies is printed as a JSON line `{"node", "grant_w", "t"}` (`t`: this machine's
monotonic clock, shared by every process). Commands on stdin, one a line:

- `hang NODE`: the agent stops without revoking its lease (as a killed or hung daemon: its lease expires);
- `announce NODE`: with `--job-size P`, NODE's cluster plane announces its pipeline a straggler (every node
  runs a `ClusterPlane` too, publishing pipeline `i % P` of job `job-{i // P}`);
- `expect JOB`: from now on, each node of JOB prints `{"saw": node, "t"}` when its plane's view first holds a
  straggler (its view polled every 10 ms: only the expected jobs' nodes are polled, so the polling, which a
  daemon does not do, costs little of the CPU the planes are measured with);
- `stats`: prints `{"stats": {node: {...}}}` (allocator CPU per round, reads, largest request and reply);
- `quit`: every agent stops and revokes its lease; the process exits.

    python benchmarks/pool_scale_worker.py --endpoints URL,URL,URL --pool P --ttl 10 --interval 0.5 NODE...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perseusd.cluster.config import ClusterConfig  # noqa: E402
from perseusd.cluster.etcd_store import Entry, EtcdStore  # noqa: E402
from perseusd.cluster.plane import ClusterPlane  # noqa: E402
from perseusd.pool.agent import PoolAgent, PoolSettings  # noqa: E402

GPUS, MIN_W, MAX_W = 8, 100.0, 400.0
_out = threading.Lock()


def emit(record: dict[str, Any]) -> None:
    line = json.dumps(record)
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def node_demand_w(node: str) -> float:
    """Node `node-0007`: 8 GPUs of 100-400 W, some of them idle (a GPU without a job asks less)."""
    index = int(node.rsplit("-", 1)[1])
    return GPUS * MAX_W - (index % 5) * 150.0


class SimNode:
    """A node's simulated GPUs as a `NodePowerTarget`: one power limit level summing to the grant."""

    def __init__(self, node: str, seed: int) -> None:
        self.node = node
        self._demand_w, self._floor_w = node_demand_w(node), GPUS * MIN_W
        self._grant_w: float | None = None
        self._random = random.Random(seed)

    def power_demand_w(self) -> float:
        return self._demand_w

    def power_floor_w(self) -> float:
        return self._floor_w

    def priority_demand_w(self) -> dict[int, float]:
        extra_w = self._demand_w - self._floor_w
        return {0: 0.6 * extra_w, 1: 0.4 * extra_w}

    def apply_grant_w(self, grant_w: float | None) -> None:
        self._grant_w = grant_w
        emit({"node": self.node, "grant_w": grant_w, "t": time.monotonic()})

    def measure_w(self) -> float:
        """What the GPUs draw: 80-95 % of what they are held to (training draws below its limit)."""
        held_w = (
            self._demand_w
            if self._grant_w is None
            else max(self._floor_w, min(self._grant_w, self._demand_w))
        )
        return held_w * self._random.uniform(0.80, 0.95)


class MeasuredStore(EtcdStore):
    """An `EtcdStore` that records the largest request body and the largest reply it handled (bytes)."""

    largest_request_b = 0
    largest_reply_b = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, float, float, int]] = []
        """The last calls that take time on a pool's critical path: ("txn" or "read", monotonic start,
        seconds, operations or entries)."""

    def _timed(self, what: str, started: float, size: int) -> None:
        self.calls = [*self.calls[-499:], (what, started, time.monotonic() - started, size)]

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> tuple[bool, int]:
        size_b = len(json.dumps({"compare": compare, "success": success, "failure": []}))
        self.largest_request_b = max(self.largest_request_b, size_b)
        started = time.monotonic()
        result = super().txn(compare, success)
        self._timed("txn", started, len(success))
        return result

    def range_prefix(self, prefix: str, revision: int = 0) -> tuple[int, list[Entry]]:
        started = time.monotonic()
        revision, entries = super().range_prefix(prefix, revision)
        self._timed("read", started, len(entries))
        self._reply(entries)
        return revision, entries

    def read_ranges(self, ranges: Any) -> tuple[int, list[Entry]]:
        revision, entries = super().read_ranges(ranges)  # type: ignore[misc,unused-ignore]
        self._reply(entries)
        return revision, entries

    def _reply(self, entries: list[Entry]) -> None:
        # base64 keys and values plus each kv's metadata fields, as the gateway sends them
        size_b = sum(4 * (len(e.key) + len(e.value)) // 3 + 110 for e in entries) + 100
        self.largest_reply_b = max(self.largest_reply_b, size_b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--pool", default="fleet")
    parser.add_argument("--ttl", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--job-size", type=int, default=0, help="pipelines per job (0: no cluster planes)")
    parser.add_argument("--no-pool", action="store_true", help="cluster planes only")
    parser.add_argument("--absent-node", choices=("hold", "release"), default="hold")
    parser.add_argument("--serial-parts", action="store_true", help="every part after the one before")
    parser.add_argument("nodes", nargs="+")
    args = parser.parse_args()
    logging.basicConfig(
        level=os.environ.get("POOL_SCALE_LOG", "WARNING"), format="%(asctime)s %(threadName)s %(message)s"
    )
    endpoints = tuple(args.endpoints.split(","))
    agents: dict[str, PoolAgent] = {}
    stores: dict[str, MeasuredStore] = {}
    part_stores: dict[str, list[MeasuredStore]] = {}
    planes: dict[str, tuple[ClusterPlane, str]] = {}
    for node in args.nodes:
        config = ClusterConfig(endpoints, node, args.ttl, 2.0, refresh_interval_s=args.interval)
        if not args.no_pool:
            sim = SimNode(node, hash(node) & 0xFFFF)
            store = MeasuredStore(config.parsed_endpoints, config.timeout_s)
            parts: list[MeasuredStore] = []
            part_stores[node] = parts

            def part_store(
                parts: list[MeasuredStore] = parts, config: ClusterConfig = config
            ) -> MeasuredStore:
                parts.append(MeasuredStore(config.parsed_endpoints, config.timeout_s))
                return parts[-1]

            settings = PoolSettings(args.pool, absent_node=args.absent_node)
            try:
                agent = PoolAgent(config, settings, sim, sim.measure_w, store, part_store=part_store)
            except TypeError:  # an agent whose allocator sends every part after the one before
                agent = PoolAgent(config, settings, sim, sim.measure_w, store)
            if args.serial_parts:
                # (the bench's comparison; the daemon has no such switch)
                agent._allocator._writer._sender = None
            agents[node], stores[node] = agent, store
            agent.start()
        if args.job_size:
            index = int(node.rsplit("-", 1)[1])
            job, pipeline = f"job-{index // args.job_size}", index % args.job_size
            plane = ClusterPlane(config)
            plane.start()
            plane.publish_pipeline(job, pipeline, iteration_time_s=1.0, t_min_s=1.0, t_max_s=1.5)
            planes[node] = (plane, job)
    expected: set[str] = set()
    if planes:
        threading.Thread(target=_watch_planes, args=(planes, expected), daemon=True).start()
    emit({"started": len(args.nodes)})
    for line in sys.stdin:
        command, _, node = line.strip().partition(" ")
        if command == "hang" and node in agents:
            agents.pop(node).stop(revoke=False, uncap=False)
            emit({"hung": node, "t": time.monotonic()})
        elif command == "announce" and node in planes:
            plane, job = planes[node]
            index = int(node.rsplit("-", 1)[1])
            plane.announce_straggler(job, index % args.job_size, 1.2)
            emit({"announced": node, "t": time.monotonic()})
        elif command == "expect":
            expected.add(node)
        elif command == "stats":
            emit({"stats": {n: _stats(a, [stores[n], *part_stores[n]]) for n, a in agents.items()}})
        elif command == "quit":
            break
    for agent in agents.values():
        agent.stop()
    for plane, _job in planes.values():
        plane.stop()
    emit({"stopped": True})


def _watch_planes(planes: dict[str, tuple[ClusterPlane, str]], expected: set[str]) -> None:
    """Print when each node of an expected job first sees a straggler in its view (polled every 10 ms)."""
    waiting = dict(planes)
    while True:
        for node, (plane, job) in list(waiting.items()):
            if job in expected and plane.snapshot(job).stragglers:
                emit({"saw": node, "t": time.monotonic()})
                del waiting[node]
        time.sleep(0.01)


def _stats(agent: PoolAgent, stores: list[MeasuredStore]) -> dict[str, Any]:
    """The agent's counters; the largest request and reply, and the allocator's calls, over its stores (its
    own, and those that sent parts of a move at once)."""
    calls = (
        sorted((c for s in stores for c in s.calls), key=lambda c: c[1]) if agent.status().allocator else []
    )
    return {
        "allocator": agent.status().allocator,
        "allocator_cpu_s": getattr(agent, "allocator_cpu_s", []),  # (main's agent has no counters)
        "reads": getattr(agent, "reads", None),
        "full_reads": getattr(agent, "full_reads", None),
        "largest_request_b": max(s.largest_request_b for s in stores),
        "largest_reply_b": max(s.largest_reply_b for s in stores),
        "calls": calls[-500:],
    }


if __name__ == "__main__":
    main()

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

    flock /tmp/perseus-bench.lock python benchmarks/bench_pool_scale.py --nodes 16,128,512,1024
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.pool_options import add_pool_options  # noqa: E402
from benchmarks.processes import process_cpu_s  # noqa: E402
from perseusd.cluster.config import parse_endpoint  # noqa: E402
from perseusd.cluster.etcd_store import EtcdStore, put_op  # noqa: E402
from perseusd.pool.admin import set_budget  # noqa: E402
from perseusd.pool.alloc import allocate  # noqa: E402
from perseusd.pool.keys import PoolKeys, decode_budget, decode_grant_record, decode_report  # noqa: E402
from perseusd.pool.view import PoolView, read_pool  # noqa: E402
from tests.support.etcd_cluster import EtcdCluster  # noqa: E402

WORKER = Path(__file__).resolve().parent / "pool_scale_worker.py"
PREFIX, POOL = "/perseus/v1", "fleet"
TOLERANCE_W = 0.05


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "p50_s": percentile(values, 0.5),
        "p99_s": percentile(values, 0.99),
        "max_s": None if not values else round(max(values), 3),
    }


class Worker:
    """One worker process and what it printed."""

    def __init__(
        self, endpoints: str, nodes: list[str], ttl_s: int, interval_s: float, extra: tuple[str, ...] = ()
    ) -> None:
        command = [sys.executable, str(WORKER), "--endpoints", endpoints, "--pool", POOL]
        command += ["--ttl", str(ttl_s), "--interval", str(interval_s), *extra, *nodes]
        self.nodes = nodes
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.events: list[tuple[str, float | None, float]] = []
        self.saw: dict[str, float] = {}
        self.announced: dict[str, float] = {}
        self.stats: dict[str, Any] | None = None
        self.started = threading.Event()
        self._stats_ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = json.loads(line)
            if "grant_w" in record:
                self.events.append((record["node"], record["grant_w"], record["t"]))
            elif "saw" in record:
                self.saw[record["saw"]] = record["t"]
            elif "announced" in record:
                self.announced[record["announced"]] = record["t"]
            elif "started" in record:
                self.started.set()
            elif "stats" in record:
                self.stats = record["stats"]
                self._stats_ready.set()

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def get_stats(self, timeout_s: float = 60.0) -> dict[str, Any]:
        self._stats_ready.clear()
        self.send("stats")
        self._stats_ready.wait(timeout_s)
        return self.stats or {}

    def cpu_s(self) -> float:
        return process_cpu_s(self.process.pid)

    def close(self) -> None:
        if self.process.poll() is None:
            self.send("quit")
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class InvariantWatch:
    """Every event of the pool from `start` on, replayed; the invariant checked at every revision."""

    def __init__(self, endpoint: str, keys: PoolKeys, start: int) -> None:
        self.keys = keys
        self.grants: dict[str, float] = {}
        self.applied: dict[str, float | None] = {}
        self.applied_revision: dict[str, int | None] = {}
        self.lowered_at: dict[str, int] = {}
        """Each node whose grant carries a higher one it may still apply (`held_w`): the revision it was
        written at."""
        self.active_w: float | None = None
        self.revisions = self.grant_revisions = 0
        self.violations: list[str] = []
        self.raise_violations: list[str] = []
        self.max_ratio = 0.0
        self.last_revision = 0
        self.grant_events = 0
        self.deleted_at: dict[str, float] = {}
        self._lowered = 0
        self.timeline: list[tuple[float, int, int, int, int]] = []
        """(arrival, monotonic s; revision; grants lowered; grants raised; reports written) per revision."""
        """When each node's report was seen deleted (its lease expired or was revoked; monotonic s)."""
        body: dict[str, Any] = {
            "create_request": {
                "key": _b64(keys.root),
                "range_end": _b64(prefix_end(keys.root)),
                "start_revision": start,
            }
        }
        self._session = requests.Session()
        self._response = self._session.post(f"{endpoint}/v3/watch", json=body, stream=True, timeout=(5, None))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self._response.iter_lines():
                if line.strip():
                    result = json.loads(line).get("result", {})
                    self._revision_batch(result.get("events") or [])
        except (OSError, ValueError, requests.RequestException):
            return

    def _revision_batch(self, events: list[dict[str, Any]]) -> None:
        by_revision: dict[int, list[dict[str, Any]]] = {}
        for event in events:
            by_revision.setdefault(int(event["kv"]["mod_revision"]), []).append(event)
        now = time.monotonic()
        for revision in sorted(by_revision):
            self._lowered = 0
            raised = self._apply(by_revision[revision])
            self._check(revision, raised)
            lowered = self._lowered
            reports = sum(
                1
                for e in by_revision[revision]
                if base64.b64decode(e["kv"]["key"]).decode().startswith(self.keys.nodes)
                and e.get("type") != "DELETE"
            )
            self.timeline.append((now, revision, lowered, len(raised), reports))

    def _apply(self, events: list[dict[str, Any]]) -> list[str]:
        raised = []
        for event in events:
            key = base64.b64decode(event["kv"]["key"]).decode()
            value = base64.b64decode(event["kv"].get("value", ""))
            deleted = event.get("type") == "DELETE"
            if key == self.keys.active:
                self.active_w = None if deleted else decode_budget(value).budget_w
            elif key.startswith(self.keys.grants):
                self.grant_events += 1
                node = key[len(self.keys.grants) :]
                self.lowered_at.pop(node, None)
                if deleted:
                    self.grants.pop(node, None)
                else:
                    record = decode_grant_record(value)
                    grant_w = record.grant_w
                    if record.held_w is not None:
                        self.lowered_at[node] = int(event["kv"]["mod_revision"])
                    if grant_w > self.grants.get(node, 0.0) + TOLERANCE_W:
                        raised.append(node)
                    elif grant_w < self.grants.get(node, grant_w) - TOLERANCE_W:
                        self._lowered += 1
                    self.grants[node] = grant_w
            elif key.startswith(self.keys.nodes):
                node = key[len(self.keys.nodes) :]
                if deleted:
                    self.applied.pop(node, None)
                    self.applied_revision.pop(node, None)
                    self.deleted_at.setdefault(node, time.monotonic())
                else:
                    report = decode_report(value)
                    self.applied[node] = report.applied_w
                    self.applied_revision[node] = getattr(report, "applied_revision", None)  # (main has none)
        return raised

    def _check(self, revision: int, raised: list[str]) -> None:
        self.revisions += 1
        self.last_revision = revision
        if not self.grants:
            return
        self.grant_revisions += 1
        if self.active_w is None:
            self.violations.append(f"revision {revision}: grants without an active budget")
            return
        granted_w = sum(self.grants.values())
        if self.active_w > 0:
            self.max_ratio = max(self.max_ratio, granted_w / self.active_w)
        if granted_w > self.active_w + 1e-6:
            self.violations.append(
                f"revision {revision}: grants {granted_w:.1f} W > budget {self.active_w:.1f} W"
            )
        if raised:
            behind = [n for n, g in self.grants.items() if n not in raised and self._behind(n, g)]
            if behind:
                self.raise_violations.append(f"revision {revision}: raised while {behind[:3]} not applied")

    def _behind(self, node: str, grant_w: float) -> bool:
        """Whether a node that reports may apply more than its grant: its report says so, or its grant
        was lowered at a revision its report has not reached (reports without revisions: main's code)."""
        if node not in self.applied:
            return False
        applied_w, applied_at = self.applied[node], self.applied_revision.get(node)
        if applied_w is not None and applied_w > grant_w + TOLERANCE_W:
            return True
        lowered_at = self.lowered_at.get(node)
        return lowered_at is not None and applied_at is not None and applied_at < lowered_at

    def close(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            self._response.raw._fp.fp.raw._sock.shutdown(2)  # unblock the reader
        self._session.close()


def prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


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


phases: list[dict[str, Any]] = []


def phase_profile(
    fleet: Fleet, set_at: float, done_at: float, targets: dict[str, float], before: dict[str, float | None]
) -> dict[str, Any]:
    """Where one budget change's time went, from the invariant watch's arrival times (s after the set)."""
    rows = [r for r in list(fleet.invariant.timeline) if set_at <= r[0] <= done_at + 0.5]
    lowers = [r for r in rows if r[2]]
    raises = [r for r in rows if r[3]]
    first_raise = raises[0][0] if raises else None
    acks = [r for r in rows if r[4] and (first_raise is None or r[0] <= first_raise)]
    n_lowered = sum(1 for n, w in targets.items() if (before.get(n) or 0.0) > w + TOLERANCE_W)
    n_raised = sum(1 for n, w in targets.items() if (before.get(n) or 0.0) < w - TOLERANCE_W)

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - set_at, 3)

    return {
        "nodes_lowered": n_lowered,
        "nodes_raised": n_raised,
        "first_lower_s": rel(lowers[0][0] if lowers else None),
        "last_lower_s": rel(lowers[-1][0] if lowers else None),
        "lower_txns": len(lowers),
        "last_ack_before_raise_s": rel(acks[-1][0] if acks else None),
        "first_raise_s": rel(first_raise),
        "last_raise_s": rel(raises[-1][0] if raises else None),
        "raise_txns": len(raises),
        "all_held_s": rel(done_at),
        "revisions": len(rows),
        "report_writes": sum(r[4] for r in rows),
    }


def budget_changes(fleet: Fleet, changes: int, rng: random.Random) -> tuple[list[float], list[float]]:
    view = fleet.view()
    floor_w = sum(r.report.floor_w for r in view.reports.values())
    demand_w = sum(r.report.demand_w for r in view.reports.values())
    latencies: list[float] = []
    per_change_max: list[float] = []
    phases.clear()
    cpu0 = cpu_split(fleet)
    windows: list[tuple[float, float]] = []
    for _ in range(changes):
        budget_w = round(floor_w + rng.uniform(0.3, 0.95) * (demand_w - floor_w), 1)
        before = fleet.held()
        targets = fleet.targets(budget_w)
        set_at = time.monotonic()
        set_budget(fleet.store, fleet.keys, budget_w, "bench")
        times = settle(fleet, targets, set_at, 120.0)
        moved = [times[n] for n, w in targets.items() if _moved(before.get(n), w)]
        latencies += moved
        per_change_max.append(max(moved, default=0.0))
        done_at = set_at + max(times.values(), default=0.0)
        phases.append(phase_profile(fleet, set_at, done_at, targets, before))
        windows.append((set_at, done_at))
        time.sleep(2.0)
    cpu1 = cpu_split(fleet)
    cpu_during_changes.clear()
    cpu_during_changes.update(
        {k: round((cpu1[k] - cpu0[k]) / (cpu1["wall"] - cpu0["wall"]), 2) for k in cpu0 if k != "wall"}
    )
    calls = fleet.workers[0].get_stats().get(fleet.names[0], {}).get("calls", [])
    for phase, (set_at, done_at) in zip(phases, windows, strict=True):
        phase["allocator_calls"] = [
            f"{what} {round(start - set_at, 3)}+{round(took, 3)} ({size})"
            for what, start, took, size in calls
            if set_at - 0.2 <= start <= done_at + 0.5
        ]
    return latencies, per_change_max


cpu_during_changes: dict[str, float] = {}


def cpu_split(fleet: Fleet) -> dict[str, float]:
    """CPU seconds so far of the allocator's process, the other agents', etcd's members and this one."""
    own = os.times()
    return {
        "allocator_process": fleet.workers[0].cpu_s(),
        "agent_processes": sum(w.cpu_s() for w in fleet.workers[1:]),
        "etcd": sum(process_cpu_s(m.process.pid) for m in fleet.etcd.members if m.process is not None),
        "bench": own.user + own.system,
        "wall": time.monotonic(),
    }


def etcd_metrics(member_url: str) -> dict[str, float]:
    text = requests.get(f"{member_url}/metrics", timeout=5).text
    wanted = (
        "etcd_server_proposals_committed_total",
        "etcd_mvcc_put_total",
        "etcd_mvcc_delete_total",
        "etcd_mvcc_txn_total",
        "etcd_debugging_mvcc_keys_total",
    )
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            values[name] = float(value)
    return values


def steady_state(fleet: Fleet, hold_s: float) -> dict[str, Any]:
    leader = fleet.etcd.leader()
    etcd_pids = [m.process.pid for m in fleet.etcd.members if m.process is not None]
    rev0, m0 = fleet.store.range_prefix(fleet.keys.root + "allocator")[0], etcd_metrics(leader.client_url)
    etcd0, agents0, t0 = (
        sum(map(process_cpu_s, etcd_pids)),
        sum(w.cpu_s() for w in fleet.workers),
        time.monotonic(),
    )
    time.sleep(hold_s)
    rev1, m1 = fleet.store.range_prefix(fleet.keys.root + "allocator")[0], etcd_metrics(leader.client_url)
    elapsed_s = time.monotonic() - t0
    etcd1, agents1 = sum(map(process_cpu_s, etcd_pids)), sum(w.cpu_s() for w in fleet.workers)
    per_s = {
        k.replace("etcd_", "").replace("_total", ""): round((m1[k] - m0.get(k, 0)) / elapsed_s, 1)
        for k in m1
        if k in m0
    }
    return {
        "window_s": round(elapsed_s, 1),
        "revisions_per_s": round((rev1 - rev0) / elapsed_s, 1),
        "per_s": per_s,
        "etcd_cpu_cores": round((etcd1 - etcd0) / elapsed_s, 2),
        "agents_cpu_cores": round((agents1 - agents0) / elapsed_s, 2),
        "load": os.getloadavg()[0],
    }


def kill_node(fleet: Fleet) -> dict[str, Any]:
    allocator = fleet.allocator()
    victim = next(n for n in reversed(fleet.names) if n != allocator)
    active = fleet.view().active
    assert active is not None
    targets = fleet.targets(active.budget_w, without={victim})
    before = fleet.held()
    changed = {n: w for n, w in targets.items() if abs((before.get(n) or 0) - w) > TOLERANCE_W}
    hung_at = time.monotonic()
    fleet.worker_of(victim).send(f"hang {victim}")
    times = settle(fleet, changed, hung_at, 120.0 + fleet.ttl_s)
    wait(lambda: victim in fleet.invariant.deleted_at, 60.0, "the report to expire")
    return {
        "node": victim,
        "ttl_s": fleet.ttl_s,
        "nodes_whose_share_grew": len(changed),
        "share_redistributed_s": round(max(times.values(), default=0.0), 3),
        "lease_expired_s": round(fleet.invariant.deleted_at[victim] - hung_at, 3),
        "phases": phase_profile(
            fleet, hung_at, hung_at + max(times.values(), default=0.0), changed, dict(before)
        ),
    }


def _moved(before_w: float | None, target_w: float) -> bool:
    return before_w is None or abs(before_w - target_w) > TOLERANCE_W


def kill_allocator(fleet: Fleet) -> dict[str, Any]:
    """SIGKILL the allocator's process just after the first transaction of a budget change (lower)."""
    allocator = fleet.allocator()
    assert allocator is not None
    worker = fleet.worker_of(allocator)
    view = fleet.view()
    assert view.active is not None
    budget_w = round(0.9 * view.active.budget_w, 1)
    survivors = {n for n in view.reports if n not in worker.nodes}
    targets = {n: w for n, w in fleet.targets(budget_w, without=set(worker.nodes)).items() if n in survivors}
    first = fleet.invariant.grant_events
    set_at = time.monotonic()
    set_budget(fleet.store, fleet.keys, budget_w, "bench")
    wait(lambda: fleet.invariant.grant_events > first, 60.0, "the first move", 0.002)
    killed_at = time.monotonic()
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    times = settle(fleet, targets, killed_at, 120.0 + 2 * fleet.ttl_s)
    return {
        "killed": allocator,
        "killed_after_set_s": round(killed_at - set_at, 3),
        "new_allocator": fleet.allocator(),
        "every_node_held_its_grant_s": round(max(times.values(), default=0.0), 3),
        "ttl_s": fleet.ttl_s,
    }


def database(fleet: Fleet, revisions_per_s: float) -> dict[str, Any]:
    def status() -> list[dict[str, Any]]:
        return [fleet.etcd.request(m, "/v3/maintenance/status", {}) for m in fleet.etcd.members if m.running]

    before = status()
    revision = int(before[0]["header"]["revision"])
    size_b = max(int(s["dbSize"]) for s in before)
    fleet.etcd.request(fleet.etcd.members[0], "/v3/kv/compaction", {"revision": revision, "physical": True})
    for member in fleet.etcd.members:
        if member.running:
            requests.post(f"{member.client_url}/v3/maintenance/defragment", json={}, timeout=60)
    after = status()
    compacted_b = max(int(s["dbSize"]) for s in after)
    per_revision_b = max(0.0, (size_b - compacted_b) / max(1, revision))
    hour_b = compacted_b + per_revision_b * revisions_per_s * 3600
    return {
        "revision": revision,
        "db_size_mib": round(size_b / 2**20, 2),
        "after_compaction_and_defrag_mib": round(compacted_b / 2**20, 2),
        "history_bytes_per_revision": round(per_revision_b, 1),
        "with_one_hour_of_history_mib": round(hour_b / 2**20, 2),
    }


def read_back_baseline(etcd: EtcdCluster) -> dict[str, Any]:
    endpoints = [parse_endpoint(e) for e in etcd.endpoints]
    writer, reader = EtcdStore(endpoints, 2.0), EtcdStore(endpoints[1:], 2.0)
    samples = []
    for i in range(20):
        key = f"{PREFIX}/baseline/{i}"
        t0 = time.monotonic()
        writer.txn([], [put_op(key, "x")])
        while not reader.get_prefix(key):
            time.sleep(0.01)
        samples.append(time.monotonic() - t0)
    writer.close()
    reader.close()
    return summary(samples)


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


def run_plane(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """The straggler plane: every node runs a `ClusterPlane` with one pipeline of a job of `--job-size`
    pipelines; one pipeline per job (up to `--announcements` jobs, 3 s apart) is announced a straggler, and
    every other node of its job's view must hold it."""
    size = args.job_size
    with tempfile.TemporaryDirectory(prefix="plane-scale-") as base:
        etcd = EtcdCluster(Path(base))
        etcd.start()
        workers: list[Worker] = []
        try:
            endpoints = ",".join(etcd.endpoints)
            names = [f"node-{i:04d}" for i in range(nodes)]
            extra = ("--no-pool", "--job-size", str(size))
            for i in range(0, nodes, args.per_process):
                workers.append(
                    Worker(endpoints, names[i : i + args.per_process], args.ttl, args.interval, extra)
                )
            for worker in workers:
                worker.started.wait(120)
            store = EtcdStore([parse_endpoint(e) for e in etcd.endpoints], timeout_s=5.0, attempts=9)
            wait(lambda: len(store.get_prefix(f"{PREFIX}/jobs/")) == nodes, 120.0, "every pipeline")
            store.close()
            etcd_pids = [m.process.pid for m in etcd.members if m.process is not None]
            cpu0 = (sum(map(process_cpu_s, etcd_pids)), sum(w.cpu_s() for w in workers), time.monotonic())
            time.sleep(5.0)
            cpu1 = (sum(map(process_cpu_s, etcd_pids)), sum(w.cpu_s() for w in workers), time.monotonic())
            latencies: list[float] = []
            jobs = min(args.announcements, nodes // size)
            missed = 0
            for job in range(jobs):
                announcer = names[job * size]
                owner = next(w for w in workers if announcer in w.nodes)
                for worker in workers:
                    worker.send(f"expect job-{job}")
                time.sleep(0.2)
                owner.send(f"announce {announcer}")
                others = names[job * size + 1 : (job + 1) * size]
                with contextlib.suppress(TimeoutError):
                    wait(
                        lambda o=others: all(any(n in w.saw for w in workers) for n in o),
                        30.0,
                        "the straggler",
                    )
                at = owner.announced.get(announcer)
                for node in others:
                    seen = next((w.saw[node] for w in workers if node in w.saw), None)
                    if seen is None or at is None:
                        missed += 1
                    else:
                        latencies.append(seen - at)
                time.sleep(3.0)
            elapsed_s = cpu1[2] - cpu0[2]
            return {
                "nodes": nodes,
                "job_size": size,
                "interval_s": args.interval,
                "straggler_seen_by_every_other_pipeline": summary(latencies) | {"missed": missed},
                "steady_etcd_cpu_cores": round((cpu1[0] - cpu0[0]) / elapsed_s, 2),
                "steady_planes_cpu_cores": round((cpu1[1] - cpu0[1]) / elapsed_s, 2),
                "load": os.getloadavg()[0],
            }
        finally:
            for worker in workers:
                worker.close()
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

"""What etcd does and costs in `bench_pool_scale.py`: the baseline (an etcd write read back by another client,
polled at 10 ms); the steady state (no change for a while: revisions/s, raft proposals and the mvcc
operations per second from the leader's metrics, the CPU of the etcd members and of the agents); and the
database at the end (its size, after compaction and defragmentation, and with the history an hour of the
measured write rate adds: what `--auto-compaction-retention=1h` keeps at most).
"""

from __future__ import annotations

import os
import time
from typing import Any

import requests

from benchmarks.pool_scale_fleet import Fleet
from benchmarks.pool_scale_process import PREFIX
from benchmarks.pool_scale_summary import summary
from benchmarks.processes import process_cpu_s
from perseusd.cluster.config import parse_endpoint
from perseusd.cluster.etcd_store import EtcdStore, put_op
from tests.support.etcd_cluster import EtcdCluster


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

"""The straggler plane at fleet scale (`bench_pool_scale.py --plane`): every node runs a `ClusterPlane` with
one pipeline of a job of `--job-size` pipelines, in `pool_scale_worker.py` processes without the pool; one
pipeline per job is announced a straggler, and the time until every other node of its job holds it in its
view is measured, with the CPU of etcd and of the planes in the steady state before.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.pool_scale_fleet import wait
from benchmarks.pool_scale_process import PREFIX, Worker
from benchmarks.pool_scale_summary import summary
from benchmarks.processes import process_cpu_s
from perseusd.cluster.config import parse_endpoint
from perseusd.cluster.etcd_store import EtcdStore
from tests.support.etcd_cluster import EtcdCluster


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

"""Data-parallel training driven from a test: one thread per worker (a stage or a pipeline, each with its
own client), all meeting at a barrier after every step (the gradient sync); and the environment of a daemon
that is one node of a cluster on a test etcd."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from perseus_client.client import PerseusClient, PerseusClientError

from tests.support.etcd_cluster import EtcdCluster


class Worker(Protocol):
    """What the lockstep needs of a worker: its client (closed at the end) and a list for its errors."""

    client: PerseusClient | None
    errors: list[BaseException]


W = TypeVar("W", bound=Worker)


class Lockstep(Generic[W]):
    """`step_fn(worker, step)` on every worker's thread, step after step, a barrier after each; `stop()` ends
    them at the next step and fails with what any of them raised."""

    def __init__(
        self, workers: Sequence[W], step_fn: Callable[[W, int], None], barrier_timeout_s: float = 60.0
    ) -> None:
        self.workers = list(workers)
        self.step = 0
        self._step_fn = step_fn
        self._barrier_timeout_s = barrier_timeout_s
        self._stop = threading.Event()
        self._barrier = threading.Barrier(len(self.workers), action=self._next_step)
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in self.workers]

    def _next_step(self) -> None:
        self.step += 1

    def start(self) -> Lockstep[W]:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, worker: W) -> None:
        try:
            while not self._stop.is_set():
                self._step_fn(worker, self.step)
                self._barrier.wait(timeout=self._barrier_timeout_s)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # reported by stop()
            worker.errors.append(exc)
            self._barrier.abort()

    def stop(self, release: bool = False) -> None:
        """End the threads and close the clients (`release`: release their GPUs first, ending the job on its
        node); fail with the errors the workers met."""
        self._stop.set()
        self._barrier.abort()
        for thread in self._threads:
            thread.join(timeout=30)
        for worker in self.workers:
            if worker.client is not None:
                if release:
                    with contextlib.suppress(PerseusClientError):
                        worker.client.release()
                worker.client.close()
        errors = [e for w in self.workers for e in w.errors]
        assert not errors, errors


def cluster_env(etcd: EtcdCluster, node: str, lease_ttl_s: float, refresh_s: float = 0.2) -> dict[str, str]:
    """The environment of a daemon that is node `node` of a cluster on `etcd` (no job cache: every test
    solves afresh)."""
    return {
        "PERSEUSD_ETCD_ENDPOINTS": ",".join(etcd.endpoints),
        "PERSEUSD_CLUSTER_NODE_NAME": node,
        "PERSEUSD_CLUSTER_LEASE_TTL_S": str(lease_ttl_s),
        "PERSEUSD_CLUSTER_REFRESH_INTERVAL_S": str(refresh_s),
        "PERSEUSD_CLUSTER_TIMEOUT_S": "0.5",
        "PERSEUSD_JOB_CACHE": "false",
    }

"""What the power pool tests share: the real 3-member etcd cluster on loopback (one per test module) and a
pool run on it per test, every daemon of it stopped at the end (a frozen one thawed first)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.support.etcd_cluster import EtcdCluster, etcd
from tests.support.power_pool import PoolRun

__all__ = ["etcd", "run"]

TTL_S = 3
"""The pool's lease TTL in these tests: every fault plays out in seconds."""


@pytest.fixture
def run(etcd: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[PoolRun]:
    etcd.restart()
    pool = PoolRun(etcd, f"pool-{request.node.name.replace('_', '-')[:40]}", ttl_s=TTL_S)
    try:
        yield pool
    finally:
        for daemon in pool.daemons.values():  # a frozen daemon must be able to stop
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.signal(signal.SIGCONT)
        pool.close()

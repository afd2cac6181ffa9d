"""The real 3-member etcd cluster on loopback that the cluster tests share, one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.etcd_cluster import EtcdCluster


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Started once per module and closed after it (tests that kill members restart it themselves)."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()

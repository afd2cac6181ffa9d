"""The real 3-member etcd cluster on loopback that the power pool tests share, one per test module."""

from __future__ import annotations

from tests.support.etcd_cluster import etcd

__all__ = ["etcd"]

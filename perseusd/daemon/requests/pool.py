"""The admin socket's power-pool requests: `admin_pool_set_budget`, `admin_pool_release` and
`admin_pool_status`.

Served on the daemon's main loop with blocking etcd calls (one try per endpoint, each within the cluster
timeout): admin requests are rare, and a pool's budget is worth an answer that says whether etcd took it.
Every budget change and release is logged with the caller (uid, pid).
"""

from __future__ import annotations

import pwd

from perseus_client.codes import ErrorCode, ProtocolError
from perseus_client.pool_messages import (
    AdminPoolRelease,
    AdminPoolSetBudget,
    AdminPoolStatus,
    PoolBudgetOk,
    PoolReleaseOk,
    PoolStatusReply,
)

from perseusd.cluster.config import NAME_PATTERN, ClusterConfig
from perseusd.cluster.etcd_store import ClusterError, EtcdStore
from perseusd.leasing.identity import Caller
from perseusd.pool.admin import ReleaseRefusedError, pool_status, release_node, set_budget
from perseusd.pool.keys import PoolKeys, check_pool


class PoolRequests:
    """Serves the pool admin messages through etcd (see module)."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self._cluster = cluster
        endpoints = cluster.parsed_endpoints
        self._store = EtcdStore(endpoints, cluster.timeout_s, attempts=len(endpoints))

    def close(self) -> None:
        self._store.close()

    def set_budget(self, caller: Caller, message: AdminPoolSetBudget) -> PoolBudgetOk:
        keys = self._keys(message.pool)
        by = describe(caller)
        try:
            set_budget(self._store, keys, message.budget_w, by)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"admin_pool_set_budget.budget_w: {exc}") from None
        except ClusterError as exc:
            raise ProtocolError(ErrorCode.INTERNAL, f"power pool {message.pool}: {exc}") from None
        return PoolBudgetOk(pool=message.pool, budget_w=message.budget_w, by=by)

    def release(self, caller: Caller, message: AdminPoolRelease) -> PoolReleaseOk:
        keys = self._keys(message.pool)
        if NAME_PATTERN.fullmatch(message.node) is None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"node name {message.node[:80]!r} must match {NAME_PATTERN.pattern}"
            )
        by = describe(caller)
        try:
            released_w = release_node(self._store, keys, message.node, by)
        except ReleaseRefusedError as exc:
            raise ProtocolError(ErrorCode.BAD_FIELD, str(exc)) from None
        except ClusterError as exc:
            raise ProtocolError(ErrorCode.INTERNAL, f"power pool {message.pool}: {exc}") from None
        return PoolReleaseOk(pool=message.pool, node=message.node, released_w=released_w, by=by)

    def status(self, _caller: Caller, message: AdminPoolStatus) -> PoolStatusReply:
        try:
            return pool_status(self._store, self._keys(message.pool))
        except ClusterError as exc:
            raise ProtocolError(ErrorCode.INTERNAL, f"power pool {message.pool}: {exc}") from None

    def _keys(self, pool: str) -> PoolKeys:
        try:
            return PoolKeys(self._cluster.prefix, check_pool(pool))
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"pool: {exc}") from None


def describe(caller: Caller) -> str:
    """`user (uid N) pid P` for the logs."""
    try:
        user = pwd.getpwuid(caller.uid).pw_name
    except KeyError:
        user = "?"
    return f"{user} (uid {caller.uid}) pid {caller.pid}"

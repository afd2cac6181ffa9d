"""etcd through its HTTP gateway (`etcd3gw`), over several endpoints, with rotation and bounded retries.

`etcd3gw` talks to one endpoint and never fails over, so each call here runs on the current endpoint and,
when that endpoint cannot answer (refused, timed out, 5xx: a dead member, a leader change, no quorum), moves
to the next one and tries again: up to `attempts` tries in all, pausing with exponential backoff after each
full round of endpoints. A definite answer (a bad request, an unknown lease) is not retried. Every failure
surfaces as one exception type, `ClusterError` (`LeaseLostError` when the lease is gone).

Not thread-safe: the cluster plane's thread owns its store. Imported only when the cluster plane is used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import (
    ConnectionFailedError,
    ConnectionTimeoutError,
    Etcd3Exception,
    InternalServerError,
)
from etcd3gw.lease import Lease

from perseusd.cluster.config import Endpoint
from perseusd.errors import PerseusError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_RETRYABLE = (ConnectionFailedError, ConnectionTimeoutError, InternalServerError, OSError, ValueError)
"""Errors that mean "this endpoint cannot answer now" (requests' own errors are OSErrors, bad JSON a
ValueError); anything else etcd says is an answer."""

API_PATH = "/v3/"
"""The gateway path of etcd 3.4 and newer (set, so no call is spent on discovering it)."""


class ClusterError(PerseusError):
    """etcd could not be reached, or refused a request, after rotating endpoints and retrying."""


class LeaseLostError(ClusterError):
    """The lease is unknown to etcd (it expired or was revoked): grant a new one and publish again."""


class EtcdStore:
    """The few etcd operations the cluster plane needs, each with failover across `endpoints`."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        timeout_s: float,
        attempts: int | None = None,
        backoff_s: float = 0.05,
        max_backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not endpoints:
            raise ClusterError("no etcd endpoints configured")
        self._endpoints = tuple(endpoints)
        self._clients = [
            Etcd3Client(e.host, e.port, e.scheme, timeout=timeout_s, api_path=API_PATH)
            for e in self._endpoints
        ]
        self._index = 0
        self.attempts = attempts if attempts is not None else 2 * len(self._endpoints)
        self._backoff_s, self._max_backoff_s, self._sleep = backoff_s, max_backoff_s, sleep
        self.rotations = 0
        """How often a call moved to another endpoint (shown in status)."""

    @property
    def endpoint(self) -> str:
        """The endpoint calls go to now."""
        return self._endpoints[self._index].url

    def _rotate(self) -> None:
        self._index = (self._index + 1) % len(self._clients)
        self.rotations += 1

    def _call(self, what: str, operation: Callable[[Etcd3Client], T]) -> T:
        """Run `operation` on the current endpoint, rotating and retrying while endpoints cannot answer."""
        backoff_s = self._backoff_s
        last: Exception | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                return operation(self._clients[self._index])
            except _RETRYABLE as exc:
                last = exc
                logger.debug("etcd %s failed on %s (attempt %d): %s", what, self.endpoint, attempt, exc)
                self._rotate()
                if attempt % len(self._clients) == 0 and attempt < self.attempts:
                    self._sleep(backoff_s)
                    backoff_s = min(2 * backoff_s, self._max_backoff_s)
            except Etcd3Exception as exc:
                detail = exc.detail_text or str(exc)
                if "lease not found" in detail:
                    raise LeaseLostError(f"etcd {what}: the lease is gone ({detail.strip()})") from exc
                raise ClusterError(f"etcd refused {what}: {detail.strip()}") from exc
        urls = ", ".join(e.url for e in self._endpoints)
        raise ClusterError(
            f"etcd {what} failed on every endpoint ({urls}) after {self.attempts} attempts: "
            f"{_describe(last)}; check that a quorum of etcd members is running and reachable"
        )

    def grant_lease(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds; returns its id."""
        return self._call("lease grant", lambda c: c.lease(ttl_s).id)

    def keep_alive(self, lease_id: int) -> int:
        """Renew a lease; returns the TTL etcd granted (s).

        Raises:
            LeaseLostError: the lease expired or was revoked.
        """
        ttl_s = self._call("lease keep-alive", lambda c: Lease(lease_id, c).refresh())
        if ttl_s <= 0:
            raise LeaseLostError(f"etcd lease keep-alive: lease {lease_id:x} has expired")
        return ttl_s

    def revoke(self, lease_id: int) -> None:
        """Revoke a lease: every key attached to it is deleted at once."""
        self._call("lease revoke", lambda c: Lease(lease_id, c).revoke())

    def put(self, key: str, value: str, lease_id: int) -> None:
        """Write `key` attached to `lease_id`."""
        self._call(f"put {key}", lambda c: c.put(key, value, Lease(lease_id, c)))

    def delete(self, key: str) -> None:
        """Delete `key` (no error if it is absent)."""
        self._call(f"delete {key}", lambda c: c.delete(key))

    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every (key, value) under `prefix`, by a linearizable read (so a member cut off from the quorum
        cannot answer with old data)."""
        entries = self._call(f"range {prefix}", lambda c: c.get_prefix(prefix))
        return [(meta["key"].decode("utf-8", "replace"), value) for value, meta in entries]

    def close(self) -> None:
        """Close every endpoint's HTTP connections."""
        for client in self._clients:
            client.session.close()


def _describe(exc: Exception | None) -> str:
    if exc is None:
        return "no attempt was made"
    text = (exc.detail_text if isinstance(exc, Etcd3Exception) else None) or str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]

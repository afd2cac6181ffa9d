"""etcd through its HTTP gateway (`etcd3gw`), over several endpoints, with rotation and bounded retries.

`etcd3gw` talks to one endpoint and never fails over, so each call here runs on the current endpoint and,
when that endpoint cannot answer (refused, timed out, 5xx: a dead member, a leader change, no quorum), moves
to the next one and tries again: up to `attempts` tries in all, pausing with exponential backoff after each
full round of endpoints. A definite answer (a bad request, an unknown lease) is not retried. Every failure
surfaces as one exception type, `ClusterError` (`LeaseLostError` when the lease is gone).

Not thread-safe: the cluster plane's thread owns its store. Imported only when the cluster plane is used.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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


@dataclass(frozen=True)
class Entry:
    """One key as etcd holds it, with its revisions and lease (0: none)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease_id: int


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

    def range_prefix(self, prefix: str, revision: int = 0) -> tuple[int, list[Entry]]:
        """The store's revision and every key under `prefix` with its metadata (linearizable), as of
        `revision` (0: now; an older one reads history, until etcd compacts it)."""
        body: dict[str, Any] = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        if revision:
            body["revision"] = revision
        reply = self._call(f"range {prefix}", lambda c: c.post(c.get_url("/kv/range"), json=body))
        entries = [_entry(kv) for kv in reply.get("kvs", [])]
        return int(reply["header"]["revision"]), entries

    def read_ranges(self, ranges: Sequence[tuple[str, str | None]]) -> tuple[int, list[Entry]]:
        """Several keys or ranges (`(key, range_end)`, `range_end` None for one key) in one linearizable
        request, at one revision: the store's revision and the entries, in the order of `ranges`."""
        success = [{"request_range": _range_body(key, end)} for key, end in ranges]
        body = {"compare": [], "success": success, "failure": []}
        reply = self._call("read", lambda c: c.post(c.get_url("/kv/txn"), json=body))
        entries = [
            _entry(kv)
            for response in reply.get("responses", [])
            for kv in response.get("response_range", {}).get("kvs", [])
        ]
        return int(reply["header"]["revision"]), entries

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> tuple[bool, int]:
        """One transaction (gateway JSON; see `compare_*`, `put_op`, `delete_op`): whether every comparison
        held (then `success` was applied) and the revision after it.

        A call retried after a timeout may find its first attempt applied: its comparisons then fail, so
        write them to fail on a second application (on revisions), and read again after a failure.
        """
        body = {"compare": compare, "success": success, "failure": []}
        reply = self._call("txn", lambda c: c.post(c.get_url("/kv/txn"), json=body))
        return bool(reply.get("succeeded", False)), int(reply["header"]["revision"])

    def close(self) -> None:
        """Close every endpoint's HTTP connections."""
        for client in self._clients:
            client.session.close()


def _describe(exc: Exception | None) -> str:
    if exc is None:
        return "no attempt was made"
    text = (exc.detail_text if isinstance(exc, Etcd3Exception) else None) or str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def _entry(kv: dict[str, Any]) -> Entry:
    return Entry(
        base64.b64decode(kv["key"]).decode("utf-8", "replace"),
        base64.b64decode(kv.get("value", "")),
        int(kv.get("create_revision", 0)),
        int(kv.get("mod_revision", 0)),
        int(kv.get("lease", 0)),
    )


def _range_body(key: str, range_end: str | None) -> dict[str, str]:
    body = {"key": _b64(key)}
    if range_end is not None:
        body["range_end"] = _b64(range_end)
    return body


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """The first key after every key starting with `prefix` (ASCII prefixes, as the plane's are)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def compare_create(key: str, revision: int) -> dict[str, Any]:
    """Holds when `key` was created at `revision` (0: the key does not exist)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": revision}


def compare_mod(key: str, revision: int) -> dict[str, Any]:
    """Holds when `key` was last written at `revision` (0: the key does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision}


def compare_lease(key: str, lease_id: int) -> dict[str, Any]:
    """Holds when `key` exists attached to `lease_id`."""
    return {"key": _b64(key), "target": "LEASE", "result": "EQUAL", "lease": str(lease_id)}


def compare_range_mod_at_most(prefix: str, revision: int) -> dict[str, Any]:
    """Holds when no key under `prefix` was written after `revision` (an empty range holds). One comparison
    for a whole range, where one per key would pass etcd's limit on a transaction's operations."""
    return {
        "key": _b64(prefix),
        "range_end": _b64(prefix_end(prefix)),
        "target": "MOD",
        "result": "LESS",
        "mod_revision": revision + 1,
    }


def compare_span_mod_at_most(key: str, range_end: str, revision: int) -> dict[str, Any]:
    """Holds when no key in [`key`, `range_end`) was written after `revision` (an empty span holds)."""
    return {
        "key": _b64(key),
        "range_end": _b64(range_end),
        "target": "MOD",
        "result": "LESS",
        "mod_revision": revision + 1,
    }


def op_key(write: dict[str, Any]) -> str:
    """The key a `put_op` or `delete_op` writes."""
    request = write.get("request_put") or write.get("request_delete_range") or {}
    return base64.b64decode(request.get("key", "")).decode("utf-8", "replace")


def compare_value(key: str, value: str) -> dict[str, Any]:
    """Holds when `key` holds exactly `value`."""
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def put_op(key: str, value: str, lease_id: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease_id:
        request["lease"] = str(lease_id)
    return {"request_put": request}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}

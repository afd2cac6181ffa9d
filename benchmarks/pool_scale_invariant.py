"""The power pool's invariant at every etcd revision of `bench_pool_scale.py`'s run, from one watch on the
pool replaying every event from a revision on: the sum of the grants is at most the active budget, and no
grant is raised while a node whose grant was lowered still applies more than its grant (its report's watts
above it, or its report older than the lowered grant's revision). The watch also keeps when each event
arrived (`timeline`, which `pool_scale_changes.phase_profile` reads) and when each node's report was deleted.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from typing import Any

import requests

from perseusd.cluster.etcd_store import prefix_end
from perseusd.pool.keys import PoolKeys, decode_budget, decode_grant_record, decode_report

TOLERANCE_W = 0.05
"""A grant differs from another (raised, lowered, a target reached) by more than this (W)."""


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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()

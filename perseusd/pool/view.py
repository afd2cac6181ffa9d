"""`PoolView`: one consistent read of a pool's keys (one etcd revision), decoded (pure, no I/O).

Malformed values (another version's, or a hand-written key) are skipped and counted, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from perseusd.cluster.etcd_store import Entry
from perseusd.pool.keys import (
    Budget,
    GrantRecord,
    NodeReport,
    PoolKeys,
    decode_budget,
    decode_grant_record,
    decode_report,
)

logger = logging.getLogger(__name__)
_T = TypeVar("_T", "Report", "Grant")


@dataclass(frozen=True)
class Grant:
    """A node's grant and the etcd entry that holds it (no lease: it outlives an absent node's report)."""

    grant_w: float
    entry: Entry
    held_w: float | None = None
    """See `GrantRecord.held_w`."""
    absent_since_s: float | None = None

    @property
    def record(self) -> GrantRecord:
        return GrantRecord(self.grant_w, self.held_w, self.absent_since_s)

    @property
    def reserved_w(self) -> float:
        return self.record.reserved_w


@dataclass(frozen=True)
class Report:
    """A node's report and the etcd entry that holds it (its lease is the node's)."""

    report: NodeReport
    entry: Entry


@dataclass(frozen=True)
class PoolView:
    """A pool as of `revision`."""

    revision: int
    request: Budget | None = None
    active: Budget | None = None
    active_entry: Entry | None = None
    reports: dict[str, Report] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    allocator: Entry | None = None
    skipped: int = 0

    @property
    def granted_w(self) -> float:
        """The sum of the grants."""
        return sum(g.grant_w for g in self.grants.values())

    @property
    def absent(self) -> dict[str, Grant]:
        """Grants of nodes whose report is gone (dead, frozen, cut off from etcd, or stopped uncleanly)."""
        return {n: g for n, g in self.grants.items() if n not in self.reports}

    @property
    def reserved_w(self) -> float:
        """What the absent nodes' GPUs may draw (their grants, or higher grants not acknowledged lower)."""
        return sum(g.reserved_w for g in self.absent.values())

    @property
    def allocator_node(self) -> str | None:
        return None if self.allocator is None else self.allocator.value.decode("utf-8", "replace")


Decoded = dict[str, Report | Grant]
"""Reports and grants decoded by an earlier read, by key: an entry of the same key and modification
revision is the same value (a key deleted and written again gets a new one), so it is not decoded again."""


def read_pool(
    keys: PoolKeys, revision: int, entries: Iterable[Entry], decoded: Decoded | None = None
) -> PoolView:
    """Decode the entries under `keys.root` (see module); with `decoded` (kept by the caller from one read
    to the next: the allocator reads a thousand reports every round), only the entries that changed."""
    request = active = None
    active_entry = allocator = None
    reports: dict[str, Report] = {}
    grants: dict[str, Grant] = {}
    skipped = 0
    seen: Decoded = {}
    for entry in entries:
        try:
            if entry.key == keys.request:
                request = decode_budget(entry.value)
            elif entry.key == keys.active:
                active, active_entry = decode_budget(entry.value), entry
            elif entry.key == keys.allocator:
                allocator = entry
            elif entry.key.startswith(keys.nodes):
                report = _known(decoded, entry, Report)
                if report is None:
                    report = Report(decode_report(entry.value), entry)
                reports[entry.key[len(keys.nodes) :]] = seen[entry.key] = report
            elif entry.key.startswith(keys.grants):
                grant = _known(decoded, entry, Grant)
                if grant is None:
                    record = decode_grant_record(entry.value)
                    grant = Grant(record.grant_w, entry, record.held_w, record.absent_since_s)
                grants[entry.key[len(keys.grants) :]] = seen[entry.key] = grant
        except ValueError as exc:
            skipped += 1
            logger.debug("power pool %s: skipped %s: %s", keys.pool, entry.key, exc)
    if decoded is not None:
        decoded.clear()
        decoded.update(seen)
    return PoolView(revision, request, active, active_entry, reports, grants, allocator, skipped)


def _known(decoded: Decoded | None, entry: Entry, kind: type[_T]) -> _T | None:
    """`entry` as an earlier read decoded it (None: not read, or changed since)."""
    if decoded is None:
        return None
    known = decoded.get(entry.key)
    if isinstance(known, kind) and known.entry.mod_revision == entry.mod_revision:
        return known
    return None

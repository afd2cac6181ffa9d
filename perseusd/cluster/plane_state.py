"""`PlaneState`: what the cluster plane's two sides share, under one lock.

The daemon's side (`perseusd.cluster.plane`) records there what this node wants etcd to hold and reads the
views; the plane's thread (`perseusd.cluster.plane_rounds`) records what it wrote and read, and the lease and
counters the status reports. Whoever holds `lock` only does in-memory bookkeeping, never a request, so the
daemon's side never waits on the network; `wake` starts the thread's next round early.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from perseusd.cluster.job_board import PipelineFacts, SpanView, StragglerAnnouncement
from perseusd.cluster.span_board import BlobRef


@dataclass
class LastView:
    """A job's view as last read from etcd (the daemon gets a copy of it, as a `JobView`)."""

    pipelines: dict[int, PipelineFacts]
    stragglers: dict[int, StragglerAnnouncement]
    refreshed_at_s: float
    span: SpanView | None = None


@dataclass(eq=False)
class PlaneState:
    """The plane's state shared between the daemon's side and the thread: every field guarded by `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)
    """Set to start the thread's next round early (publications, watch events, withdrawals)."""
    desired: dict[str, str] = field(default_factory=dict)
    """What this node wants in etcd (key to value)."""
    written: dict[str, str] = field(default_factory=dict)
    """What is there under the current lease."""
    to_delete: set[str] = field(default_factory=set)
    followed: set[str] = field(default_factory=set)
    views: dict[str, LastView] = field(default_factory=dict)
    campaigns: set[str] = field(default_factory=set)
    resigns: set[str] = field(default_factory=set)
    wanted_blobs: dict[tuple[str, str], BlobRef] = field(default_factory=dict)
    blobs: dict[tuple[str, str], bytes] = field(default_factory=dict)
    kept_alive_at_s: float | None = None
    round_ok_at_s: float | None = None
    rounds: int = 0
    errors: int = 0
    grants: int = 0
    skipped: int = 0
    last_error: str | None = None
    changed: set[str] = field(default_factory=set)
    """Jobs whose watch reported a change (or that were just followed): re-read at the next round."""
    lease_id: int | None = None
    """The current lease (written under `lock` by the thread, which alone reads it without the lock)."""

"""What this node keeps about a job whose pipelines span nodes: its share, the last view of the others, the
plan it follows, and, on the node that leads the job, each pipeline's straggler detector."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from perseusd.cluster.job_board import SpanView
from perseusd.cluster.span_board import BlobRef, MemberRecord, PlanRecord, ProfileShare
from perseusd.jobs.straggling import ActiveStraggler, Detector
from perseusd.planner.profile import Profile

COMPUTE_SAMPLES = 3


@dataclass
class GlobalRun:
    """One pipeline of the job as its leader sees it (every node's part merged): its detector."""

    pipeline: int
    detector: Detector
    last_step: int = -1
    compute_times_s: deque[float] = field(default_factory=lambda: deque(maxlen=COMPUTE_SAMPLES))


@dataclass
class SpanState:
    """A spanning job on this node (see `perseusd.jobs.spanning`)."""

    node: str
    share: ProfileShare | None = None
    """This node's measured profile as shared (None until its stages are profiled)."""
    error: str = ""
    """Why this node's part cannot be planned (its profiling failed): the leader fails the job with it."""
    view: SpanView | None = None
    view_state: str = "expired"
    plan: PlanRecord | None = None
    """The last plan seen (kept when its key vanishes with a leader that went)."""
    applied_epoch: int = 0
    solution: BlobRef | None = None
    """The solution (frontier and merged profile) this node runs (None: none loaded yet)."""
    solution_data: bytes | None = None
    """Its bytes, to share again if this node takes over as leader."""
    solving: BlobRef | None = None
    """Leader: set while its solve is in flight."""
    merged: tuple[Profile, float] | None = None
    """Leader: the merged profile and blocking power of the solve in flight (or last solved)."""
    announced: dict[int, float] = field(default_factory=dict)
    """Straggler announcements in etcd (any node's `perseusctl straggler`), by pipeline."""
    planned_announcements: dict[int, float] = field(default_factory=dict)
    """Leader: the announcements its last decision knew."""
    policy_since: float = 0.0
    """When the job's policy was last set on this node (wall clock; 0: never): the newest one wins."""
    # Leader: each pipeline's detector, the stragglers detected, when detection may resume.
    runs: dict[int, GlobalRun] = field(default_factory=dict)
    detected: dict[int, ActiveStraggler] = field(default_factory=dict)
    detect_from_step: int = 0
    leading: bool = False
    own: MemberRecord | None = None
    """This node's record as last shared."""
    synced_at_s: float = -1e9
    """When the view was last read and the record shared (monotonic)."""
    detected_view: SpanView | None = None
    """Leader: the view its detectors last looked at."""

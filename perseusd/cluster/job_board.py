"""What the daemons of one job share through etcd: key layout, JSON values, and the per-job view.

Pure data, no I/O. Keys, under the configured prefix (default `/perseus/v1`):

- `<prefix>/jobs/<job>/pipelines/<p>`: one pipeline's facts, published by the node that runs it:
  `{"version": 1, "node": ..., "iteration_time_s": ..., "t_min_s": ..., "t_max_s": ..., "plan_time_s": ...}`
  (the measured compute time of its iterations, the time range of its frontier, and the time of the point it
  runs; `plan_time_s` may be absent in values of older nodes and then reads as `t_min_s`);
- `<prefix>/jobs/<job>/stragglers/<p>`: an announced straggler (`perseusctl straggler JOB --pipeline P
  --factor F`): `{"version": 1, "node": ..., "factor": ...}`.

Every key is attached to the publishing node's lease, so a dead node's entries vanish within the lease TTL.
Values that do not decode are skipped (and counted), never fatal: another node may run a newer version.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perseusd.cluster.span_board import MemberRecord, PlanRecord, check_name, job_prefix
from perseusd.cluster.span_codec import decode_leader, decode_member, decode_plan

VALUE_VERSION = 1
MAX_PIPELINE = 1_000_000


class ViewState(enum.Enum):
    """How far a job view can be trusted.

    FRESH: refreshed recently. STALE: etcd has not answered for a while; the last view is served as is.
    EXPIRED: this node's lease would have expired (no keep-alive for a whole TTL): others may have dropped
    this node, and its view of them is too old to slow anything down for; fall back to the no-slowdown plan.
    """

    FRESH = "fresh"
    STALE = "stale"
    EXPIRED = "expired"


@dataclass(frozen=True)
class PipelineFacts:
    """One pipeline's shared facts: who runs it, its measured iteration time, its frontier's time range."""

    node: str
    iteration_time_s: float
    t_min_s: float
    t_max_s: float
    plan_time_s: float | None = None
    """The time of the frontier point it runs (None: `t_min_s`, the fastest)."""

    def __post_init__(self) -> None:
        times = (self.iteration_time_s, self.t_min_s, self.t_max_s, self.planned_time_s)
        if not all(math.isfinite(t) and t > 0 for t in times) or self.t_min_s > self.t_max_s:
            raise ValueError(f"pipeline times must be positive and t_min_s <= t_max_s (got {times})")
        check_name("node", self.node)

    @property
    def planned_time_s(self) -> float:
        return self.t_min_s if self.plan_time_s is None else self.plan_time_s

    @property
    def slowness(self) -> float:
        """Measured compute time over the running point's time: the factor by which it is slow."""
        return self.iteration_time_s / self.planned_time_s


@dataclass(frozen=True)
class StragglerAnnouncement:
    """A pipeline announced as a straggler by `factor` (its iteration takes factor x the others' time)."""

    node: str
    factor: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"a straggler factor must be a finite number >= 1 (got {self.factor})")
        check_name("node", self.node)


@dataclass(frozen=True)
class SpanView:
    """What etcd holds of a job whose pipelines span nodes: each node's record, the leader, its plan."""

    members: Mapping[str, MemberRecord] = field(default_factory=dict)
    leader: str | None = None
    plan: PlanRecord | None = None


@dataclass(frozen=True)
class JobView:
    """The last known facts of one job's pipelines (every node's, this one's included), and their state.

    `age_s` is the time since the view was last read from etcd (infinite when it never was).
    """

    job: str
    pipelines: Mapping[int, PipelineFacts] = field(default_factory=dict)
    stragglers: Mapping[int, StragglerAnnouncement] = field(default_factory=dict)
    state: ViewState = ViewState.EXPIRED
    age_s: float = math.inf
    span: SpanView | None = None
    """The records of a job whose pipelines span nodes (None when etcd holds none)."""

    @property
    def fresh(self) -> bool:
        """Whether the view was refreshed recently and this node's lease is alive."""
        return self.state is ViewState.FRESH

    @property
    def usable(self) -> bool:
        """Whether a plan may rely on the view (fresh or stale); an expired view means no slowdown."""
        return self.state is not ViewState.EXPIRED


def check_pipeline(pipeline: int) -> int:
    """`pipeline` if it is a valid pipeline index (its data-parallel rank), else ValueError."""
    if isinstance(pipeline, bool) or not isinstance(pipeline, int) or not 0 <= pipeline <= MAX_PIPELINE:
        raise ValueError(f"a pipeline index must be an integer 0..{MAX_PIPELINE} (got {pipeline!r})")
    return pipeline


def pipeline_key(prefix: str, job: str, pipeline: int) -> str:
    """The key of one pipeline's facts."""
    return f"{job_prefix(prefix, job)}pipelines/{check_pipeline(pipeline)}"


def straggler_key(prefix: str, job: str, pipeline: int) -> str:
    """The key of one pipeline's straggler announcement."""
    return f"{job_prefix(prefix, job)}stragglers/{check_pipeline(pipeline)}"


def encode_facts(facts: PipelineFacts) -> str:
    """The JSON value of a pipeline key."""
    doc = {
        "version": VALUE_VERSION,
        "node": facts.node,
        "iteration_time_s": facts.iteration_time_s,
        "t_min_s": facts.t_min_s,
        "t_max_s": facts.t_max_s,
    }
    if facts.plan_time_s is not None:
        doc["plan_time_s"] = facts.plan_time_s
    return json.dumps(doc, sort_keys=True)


def encode_announcement(announcement: StragglerAnnouncement) -> str:
    """The JSON value of a straggler key."""
    doc = {"version": VALUE_VERSION, "node": announcement.node, "factor": announcement.factor}
    return json.dumps(doc, sort_keys=True)


def _number(doc: Mapping[str, Any], name: str) -> float:
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is not a number")
    return float(value)


def _document(raw: bytes) -> dict[str, Any]:
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("version") != VALUE_VERSION:
        raise ValueError("not a version 1 object")
    return doc


def decode_entry(job_key_prefix: str, key: str, raw: bytes) -> tuple[str, int, object]:
    """One entry under a job's prefix as (`pipelines` or `stragglers`, pipeline, facts or announcement).

    Raises:
        ValueError: the key or the value is not one this version understands.
    """
    kind, _, index = key.removeprefix(job_key_prefix).partition("/")
    if not index.isdigit() or kind not in ("pipelines", "stragglers"):
        raise ValueError(f"unknown key {key!r}")
    pipeline = check_pipeline(int(index))
    doc = _document(raw)
    try:
        if kind == "pipelines":
            iteration_s, t_min_s, t_max_s = (
                _number(doc, n) for n in ("iteration_time_s", "t_min_s", "t_max_s")
            )
            plan_s = _number(doc, "plan_time_s") if "plan_time_s" in doc else None
            return kind, pipeline, PipelineFacts(doc["node"], iteration_s, t_min_s, t_max_s, plan_s)
        return kind, pipeline, StragglerAnnouncement(doc["node"], _number(doc, "factor"))
    except KeyError as exc:
        raise ValueError(f"missing field {exc}") from None


def build_view(
    job: str, prefix: str, entries: list[tuple[str, bytes]]
) -> tuple[dict[int, PipelineFacts], dict[int, StragglerAnnouncement], int]:
    """Decode a job's (key, value) entries; returns its pipelines, its stragglers and the number skipped."""
    pipelines, stragglers, _span, skipped = build_full_view(job, prefix, entries)
    return pipelines, stragglers, skipped


def build_full_view(
    job: str, prefix: str, entries: list[tuple[str, bytes]]
) -> tuple[dict[int, PipelineFacts], dict[int, StragglerAnnouncement], SpanView | None, int]:
    """Decode a job's (key, value) entries: its pipelines, its stragglers, its spanning records (None when
    there are none) and the number of entries skipped."""
    job_key_prefix = job_prefix(prefix, job)
    pipelines: dict[int, PipelineFacts] = {}
    stragglers: dict[int, StragglerAnnouncement] = {}
    members: dict[str, MemberRecord] = {}
    leader: list[str] = []
    plans: list[PlanRecord] = []
    skipped = 0
    for key, raw in entries:
        rest = key.removeprefix(job_key_prefix)
        try:
            if rest.startswith("members/"):
                record = decode_member(raw)
                if record.node != rest.removeprefix("members/"):
                    raise ValueError("a member record under another node's key")
                members[record.node] = record
                continue
            if rest == "leader":
                leader.append(decode_leader(raw))
                continue
            if rest == "plan":
                plans.append(decode_plan(raw))
                continue
            kind, pipeline, value = decode_entry(job_key_prefix, key, raw)
        except (ValueError, UnicodeDecodeError):
            skipped += 1
            continue
        if isinstance(value, PipelineFacts):
            pipelines[pipeline] = value
        elif isinstance(value, StragglerAnnouncement) and kind == "stragglers":
            stragglers[pipeline] = value
    span = None
    if members or leader or plans:
        span = SpanView(members, leader[0] if leader else None, plans[0] if plans else None)
    return pipelines, stragglers, span, skipped


def view_state(
    now_s: float,
    refreshed_at_s: float | None,
    kept_alive_at_s: float | None,
    stale_after_s: float,
    ttl_s: float,
) -> ViewState:
    """The state of a view refreshed at `refreshed_at_s` by a node last kept alive at `kept_alive_at_s`.

    Monotonic clock readings; None means never. Expired wins: a node whose lease would have expired must not
    keep slowing down for facts it can no longer confirm.
    """
    if kept_alive_at_s is None or now_s - kept_alive_at_s >= ttl_s:
        return ViewState.EXPIRED
    if refreshed_at_s is None or now_s - refreshed_at_s > stale_after_s:
        return ViewState.STALE
    return ViewState.FRESH

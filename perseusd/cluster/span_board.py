"""What the nodes of a job whose pipelines span nodes share through etcd: its identity, each node's record,
the solving node's plan, and the large documents (profiles, the solution) stored as blobs, and the keys that
hold them. Pure data, no I/O: `span_codec` writes and reads the values, `span_blobs` chunks a blob.

Keys, under the configured prefix, with `<job>` the job's identity key (`JobIdentity.key`, not its name:
two jobs of the same name but another owner, shape or run never share a key):

- `<prefix>/jobs/<job>/members/<node>`: a `MemberRecord`, written by that node (its lease);
- `<prefix>/jobs/<job>/leader`: `{"version": 1, "node": ...}`, created only when absent (an etcd transaction)
  by the node that then solves and re-plans the job (its lease: it vanishes when that node goes);
- `<prefix>/jobs/<job>/plan`: a `PlanRecord`, written by the leader (its lease);
- `<prefix>/blobs/<job>/<name>/<digest>/<i>`: chunk `i` of a blob (gzip, base64), written by its owner.

Values are JSON objects with `"version": 1`; a value this version cannot decode is skipped and counted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from perseusd.cluster.config import NAME_PATTERN
from perseusd.cluster.span_fields import int_field, object_doc, str_field

MAX_BLOB_CHUNKS = 256


@dataclass(frozen=True)
class JobIdentity:
    """What makes registrations on different nodes one job: name, owner, shape and run."""

    name: str
    uid: int
    schedule: str
    num_stages: int
    num_microbatches: int
    chunks: int
    stage_gpus: int
    run: str

    def key(self) -> str:
        """The job's etcd key component: a digest of the whole identity (any job name works)."""
        digest = hashlib.sha256(json.dumps(self.to_doc(), sort_keys=True).encode()).hexdigest()
        return f"job-{digest[:32]}"

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Any) -> JobIdentity:
        doc = object_doc(doc, "identity")
        return cls(
            name=str_field(doc, "name"),
            uid=int_field(doc, "uid"),
            schedule=str_field(doc, "schedule"),
            num_stages=int_field(doc, "num_stages"),
            num_microbatches=int_field(doc, "num_microbatches"),
            chunks=int_field(doc, "chunks"),
            stage_gpus=int_field(doc, "stage_gpus"),
            run=str_field(doc, "run"),
        )


@dataclass(frozen=True)
class BlobRef:
    """A blob: its name, the sha256 of its bytes, and how many chunks hold it."""

    name: str
    digest: str
    chunks: int

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Any) -> BlobRef:
        doc = object_doc(doc, "blob")
        ref = cls(str_field(doc, "name"), str_field(doc, "digest"), int_field(doc, "chunks"))
        if NAME_PATTERN.fullmatch(ref.name) is None or not 1 <= ref.chunks <= MAX_BLOB_CHUNKS:
            raise ValueError(f"bad blob reference {doc!r}")
        return ref


@dataclass(frozen=True)
class ProfileShare:
    """A node's measured profile of the stages it runs: the blob, and what the solve needs beside it."""

    blob: BlobRef
    p_block_w: float
    """Blocking power of one stage (its GPUs together), W."""
    iteration_overhead_s: float | None
    """Measured all-max iteration minus the profile's prediction (None: not measured)."""


@dataclass(frozen=True)
class PipelineSpan:
    """A node's part of one pipeline's step: its stages' step begin to their last computation's end."""

    pipeline: int
    step: int
    compute_s: float


@dataclass(frozen=True)
class MemberRecord:
    """One node's part of a spanning job."""

    node: str
    identity: JobIdentity
    slots: tuple[tuple[int, int], ...]
    """(pipeline, stage) of every stage it runs."""
    state: str
    profiling_iterations: int = 0
    profiling_energy_j: float = 0.0
    profile: ProfileShare | None = None
    measured_j: float | None = None
    """Energy per iteration of its GPUs of the job while the plan runs, by the counters."""
    measured_all_max_j: float | None = None
    spans: tuple[PipelineSpan, ...] = ()
    error: str = ""
    """Why its part cannot be planned (its profiling failed): the leader fails the job with it."""
    policy: str = ""
    """The policy set on it for the job ("" with `target`: the daemon's default) ..."""
    target: float = 0.0
    policy_since: float = 0.0
    """... and when (wall clock, 0: never set there): the leader follows the newest."""
    clock_latency_s: float | None = None
    """The slowest clock-set latency measured on its GPUs of the job: the solve plans for every node's."""


@dataclass(frozen=True)
class PipelinePlan:
    """The point one pipeline runs from `from_step` on (all its stages, on every node)."""

    pipeline: int
    point: int
    from_step: int


@dataclass(frozen=True)
class StragglerPlan:
    pipeline: int
    factor: float
    source: str
    since_step: int


@dataclass(frozen=True)
class PlanRecord:
    """The leader's decision for the whole job."""

    node: str
    epoch: int
    solves: int
    solution: BlobRef | None
    error: str
    """Set when the job cannot be planned: every node fails it with this reason."""
    base: int
    pipelines: tuple[PipelinePlan, ...] = ()
    straggler: StragglerPlan | None = None

    def point_for(self, pipeline: int) -> PipelinePlan | None:
        return next((p for p in self.pipelines if p.pipeline == pipeline), None)


def check_name(what: str, name: str) -> str:
    """`name` if it is a valid job, node or blob name (a single etcd key component), else ValueError."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise ValueError(f"{what} name {name!r} must match {NAME_PATTERN.pattern}")
    return name


def job_prefix(prefix: str, job: str) -> str:
    """The prefix of every key of `job` (ends with `/`): its pipelines' and stragglers' (`job_board`), its
    members', leader's and plan's."""
    return f"{prefix}/jobs/{check_name('job', job)}/"


def member_key(prefix: str, job: str, node: str) -> str:
    return f"{job_prefix(prefix, job)}members/{check_name('node', node)}"


def leader_key(prefix: str, job: str) -> str:
    return f"{job_prefix(prefix, job)}leader"


def plan_key(prefix: str, job: str) -> str:
    return f"{job_prefix(prefix, job)}plan"


def blob_prefix(prefix: str, job: str, name: str) -> str:
    """The prefix of every chunk of every version of one blob (ends with `/`)."""
    return f"{blob_job_prefix(prefix, job)}{check_name('blob', name)}/"


def blob_job_prefix(prefix: str, job: str) -> str:
    """The prefix of every blob of `job` (ends with `/`)."""
    return f"{prefix}/blobs/{check_name('job', job)}/"


def chunk_key(prefix: str, job: str, ref: BlobRef, index: int) -> str:
    return f"{blob_prefix(prefix, job, ref.name)}{ref.digest}/{index}"

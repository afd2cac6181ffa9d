"""What the nodes of a job whose pipelines span nodes share through etcd: its identity, each node's record,
the solving node's plan, and the large documents (profiles, the solution) stored as blobs. Pure data, no I/O.

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

import base64
import gzip
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from perseusd.cluster.config import NAME_PATTERN

SPAN_VERSION = 1
BLOB_CHUNK_BYTES = 512 * 1024
"""Chunk size of a blob's base64 text: etcd refuses requests over 1.5 MiB by default."""
MAX_BLOB_CHUNKS = 256
MAX_SLOTS = 100_000


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
        doc = _object(doc, "identity")
        return cls(
            name=_str(doc, "name"),
            uid=_int(doc, "uid"),
            schedule=_str(doc, "schedule"),
            num_stages=_int(doc, "num_stages"),
            num_microbatches=_int(doc, "num_microbatches"),
            chunks=_int(doc, "chunks"),
            stage_gpus=_int(doc, "stage_gpus"),
            run=_str(doc, "run"),
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
        doc = _object(doc, "blob")
        ref = cls(_str(doc, "name"), _str(doc, "digest"), _int(doc, "chunks"))
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


# -- encoding -----------------------------------------------------------------------------------------------


def encode_member(record: MemberRecord) -> str:
    doc: dict[str, Any] = {
        "version": SPAN_VERSION,
        "node": record.node,
        "identity": record.identity.to_doc(),
        "slots": [list(slot) for slot in record.slots],
        "state": record.state,
        "profiling_iterations": record.profiling_iterations,
        "profiling_energy_j": record.profiling_energy_j,
        "measured_j": record.measured_j,
        "measured_all_max_j": record.measured_all_max_j,
        "spans": [[s.pipeline, s.step, s.compute_s] for s in record.spans],
        "error": record.error,
        "policy": [record.policy, record.target, record.policy_since],
        "clock_latency_s": record.clock_latency_s,
    }
    if record.profile is not None:
        doc["profile"] = {
            "blob": record.profile.blob.to_doc(),
            "p_block_w": record.profile.p_block_w,
            "iteration_overhead_s": record.profile.iteration_overhead_s,
        }
    return json.dumps(doc, sort_keys=True)


def encode_leader(node: str) -> str:
    return json.dumps({"version": SPAN_VERSION, "node": check_name("node", node)}, sort_keys=True)


def encode_plan(plan: PlanRecord) -> str:
    doc: dict[str, Any] = {
        "version": SPAN_VERSION,
        "node": plan.node,
        "epoch": plan.epoch,
        "solves": plan.solves,
        "solution": None if plan.solution is None else plan.solution.to_doc(),
        "error": plan.error,
        "base": plan.base,
        "pipelines": [[p.pipeline, p.point, p.from_step] for p in plan.pipelines],
        "straggler": None
        if plan.straggler is None
        else [
            plan.straggler.pipeline,
            plan.straggler.factor,
            plan.straggler.source,
            plan.straggler.since_step,
        ],
    }
    return json.dumps(doc, sort_keys=True)


# -- decoding (ValueError for anything this version does not understand) ----------------------------------


def decode_member(raw: bytes) -> MemberRecord:
    doc = _document(raw)
    slots = doc.get("slots")
    if not isinstance(slots, list) or len(slots) > MAX_SLOTS:
        raise ValueError("slots is not a list")
    profile = doc.get("profile")
    spans = doc.get("spans", [])
    if not isinstance(spans, list):
        raise ValueError("spans is not a list")
    return MemberRecord(
        node=check_name("node", _str(doc, "node")),
        identity=JobIdentity.from_doc(doc.get("identity")),
        slots=tuple(_int_pair(slot) for slot in slots),
        state=_str(doc, "state"),
        profiling_iterations=_int(doc, "profiling_iterations"),
        profiling_energy_j=_float(doc, "profiling_energy_j"),
        profile=None if profile is None else _profile_share(profile),
        measured_j=_optional_float(doc, "measured_j"),
        measured_all_max_j=_optional_float(doc, "measured_all_max_j"),
        spans=tuple(_span(item) for item in spans),
        error=_str(doc, "error"),
        **_policy(doc.get("policy")),
        clock_latency_s=_optional_float(doc, "clock_latency_s"),
    )


def decode_leader(raw: bytes) -> str:
    return check_name("node", _str(_document(raw), "node"))


def decode_plan(raw: bytes) -> PlanRecord:
    doc = _document(raw)
    pipelines = doc.get("pipelines")
    if not isinstance(pipelines, list):
        raise ValueError("pipelines is not a list")
    solution = doc.get("solution")
    straggler = doc.get("straggler")
    return PlanRecord(
        node=check_name("node", _str(doc, "node")),
        epoch=_int(doc, "epoch"),
        solves=_int(doc, "solves"),
        solution=None if solution is None else BlobRef.from_doc(solution),
        error=_str(doc, "error"),
        base=_int(doc, "base"),
        pipelines=tuple(_pipeline_plan(item) for item in pipelines),
        straggler=None if straggler is None else _straggler_plan(straggler),
    )


def _profile_share(doc: Any) -> ProfileShare:
    doc = _object(doc, "profile")
    return ProfileShare(
        BlobRef.from_doc(doc.get("blob")),
        _float(doc, "p_block_w"),
        _optional_float(doc, "iteration_overhead_s"),
    )


def _policy(item: Any) -> dict[str, Any]:
    if not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], str):
        raise ValueError("a policy is [name, target, since]")
    return {"policy": item[0], "target": _plain_float(item[1]), "policy_since": _plain_float(item[2])}


def _span(item: Any) -> PipelineSpan:
    if not isinstance(item, list) or len(item) != 3:
        raise ValueError("a span is [pipeline, step, compute_s]")
    pipeline, step = _plain_int(item[0]), _plain_int(item[1])
    return PipelineSpan(pipeline, step, _plain_float(item[2]))


def _pipeline_plan(item: Any) -> PipelinePlan:
    if not isinstance(item, list) or len(item) != 3:
        raise ValueError("a pipeline plan is [pipeline, point, from_step]")
    return PipelinePlan(*(_plain_int(v) for v in item))


def _straggler_plan(item: Any) -> StragglerPlan:
    if not isinstance(item, list) or len(item) != 4 or not isinstance(item[2], str):
        raise ValueError("a straggler is [pipeline, factor, source, since_step]")
    return StragglerPlan(_plain_int(item[0]), _plain_float(item[1]), item[2], _plain_int(item[3]))


def _int_pair(item: Any) -> tuple[int, int]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError("a slot is [pipeline, stage]")
    return _plain_int(item[0]), _plain_int(item[1])


def _object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is not an object")
    return doc


def _document(raw: bytes) -> dict[str, Any]:
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("version") != SPAN_VERSION:
        raise ValueError("not a version 1 object")
    return doc


def _plain_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def _plain_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


def _int(doc: Mapping[str, Any], name: str) -> int:
    if name not in doc:
        raise ValueError(f"missing field {name!r}")
    return _plain_int(doc[name])


def _float(doc: Mapping[str, Any], name: str) -> float:
    if name not in doc:
        raise ValueError(f"missing field {name!r}")
    return _plain_float(doc[name])


def _optional_float(doc: Mapping[str, Any], name: str) -> float | None:
    value = doc.get(name)
    return None if value is None else _plain_float(value)


def _str(doc: Mapping[str, Any], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} is not a string")
    return value


# -- blobs ----------------------------------------------------------------------------------------------


def blob_chunks(name: str, data: bytes) -> tuple[BlobRef, list[str]]:
    """`data` as a blob: its reference and the chunk values (gzip, base64, `BLOB_CHUNK_BYTES` each)."""
    check_name("blob", name)
    text = base64.b64encode(gzip.compress(data, mtime=0)).decode("ascii")
    chunks = [text[i : i + BLOB_CHUNK_BYTES] for i in range(0, len(text), BLOB_CHUNK_BYTES)] or [""]
    if len(chunks) > MAX_BLOB_CHUNKS:
        raise ValueError(f"blob {name} is too large ({len(text)} bytes compressed)")
    return BlobRef(name, hashlib.sha256(data).hexdigest(), len(chunks)), chunks


def join_blob(ref: BlobRef, chunks: Mapping[int, bytes]) -> bytes:
    """The blob's bytes from its chunks; ValueError when one is missing or the digest does not match."""
    if sorted(chunks) != list(range(ref.chunks)):
        raise ValueError(f"blob {ref.name}: {len(chunks)} of {ref.chunks} chunks")
    text = b"".join(chunks[i] for i in range(ref.chunks))
    try:
        data = gzip.decompress(base64.b64decode(text, validate=True))
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"blob {ref.name} does not decode: {exc}") from None
    if hashlib.sha256(data).hexdigest() != ref.digest:
        raise ValueError(f"blob {ref.name}: digest mismatch")
    return data

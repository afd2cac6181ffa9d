"""The job messages of the wire protocol (protocol 3 and later): registration, policies, the jobs table,
frontier, plan and profile documents, straggler announcements. `perseus_client.protocol` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.job_info import (
    JobInfo,
    PipelineInfo,
    PlanningInfo,
    ProfilingInfo,
    SpanInfo,
    SpanMember,
    StragglerInfo,
)
from perseus_client.message import GpuMessage, JobMessage, Message, Policy, Schedule
from perseus_client.version import since

__all__ = [
    "AnnounceStraggler",
    "AnnounceStragglerOk",
    "DocumentReply",
    "FrontierRequest",
    "JobInfo",
    "JobsReply",
    "JobsRequest",
    "PipelineInfo",
    "PlanRequest",
    "PlanningInfo",
    "ProfileExport",
    "ProfileImport",
    "ProfileImportOk",
    "ProfileReply",
    "ProfilingInfo",
    "Register",
    "RegisterOk",
    "SetPolicy",
    "SetPolicyOk",
    "SpanInfo",
    "SpanMember",
    "StragglerInfo",
    "StragglerNotice",
]


@dataclass(frozen=True)
class Register(GpuMessage, wire_type="register"):
    """Join a job with a leased GPU: this process runs `stage` of data-parallel pipeline `pipeline`."""

    job: str
    pipeline: int
    stage: int
    num_stages: int
    num_microbatches: int
    schedule: Schedule
    chunks: int
    """Model chunks (virtual stages) per GPU: > 1 only for the interleaved schedules, 2 for zbv."""
    stage_gpus: int = since(4, 1)
    """GPUs that run each stage together, in step (tensor x context parallel): every rank of the stage
    registers the same `pipeline` and `stage`; the daemon profiles, plans and switches them as one stage."""
    run: str = since(4, "")
    """An id every process of one run of the job shares (the launcher's job id): jobs of the same name on
    different nodes are one job only when their runs (and owner and shape) are the same."""


@dataclass(frozen=True)
class RegisterOk(JobMessage, wire_type="register_ok"):
    state: str
    cached: bool
    """The job's profile and frontier came from the on-disk cache: no profiling, no solving."""


@dataclass(frozen=True)
class SetPolicy(JobMessage, wire_type="set_policy"):
    """Choose which frontier point a job runs (by its owner or an admin); takes effect at once."""

    policy: Policy
    target: float
    """The slowdown fraction for "slowdown", seconds for "time", ignored otherwise."""


@dataclass(frozen=True)
class SetPolicyOk(JobMessage, wire_type="set_policy_ok"):
    policy: str
    target: float


@dataclass(frozen=True)
class StragglerNotice(JobMessage):
    """That `pipeline` of `job` straggles by `factor` (>= 1: its iterations take `factor` times its plan's
    time), or with `clear`, no longer does: an announcement and its reply."""

    pipeline: int
    factor: float
    clear: bool


@dataclass(frozen=True)
class AnnounceStraggler(StragglerNotice, wire_type="announce_straggler"):
    """Announce (or with `clear`, withdraw) a straggling pipeline. The job's other pipelines move to the
    least-energy plan that is no slower than the straggler; shared with the job's other nodes when a cluster
    is configured."""


@dataclass(frozen=True)
class AnnounceStragglerOk(StragglerNotice, wire_type="announce_straggler_ok"):
    shared: bool
    """Whether the announcement goes to the cluster plane (etcd) too."""


@dataclass(frozen=True)
class JobsRequest(Message, wire_type="jobs"):
    """The caller's jobs (an admin's: every job), ended ones included (`JobsReply`)."""


@dataclass(frozen=True)
class JobsReply(Message, wire_type="jobs_ok"):
    jobs: tuple[JobInfo, ...]


@dataclass(frozen=True)
class FrontierRequest(JobMessage, wire_type="frontier"):
    """`job`'s time-energy frontier, as a `perseus-frontier` document (`DocumentReply`)."""


@dataclass(frozen=True)
class PlanRequest(JobMessage, wire_type="plan"):
    """The plan `job` runs, as a `perseus-plan` document (`DocumentReply`)."""


@dataclass(frozen=True)
class DocumentReply(JobMessage, wire_type="document"):
    """A versioned JSON document (a `perseus-frontier` or `perseus-plan`, see docs/planner.md) as text."""

    document: str


@dataclass(frozen=True)
class ProfileExport(JobMessage, wire_type="profile_export"):
    """`job`'s profile, as CSV (`ProfileReply`)."""


@dataclass(frozen=True)
class ProfileReply(JobMessage, wire_type="profile"):
    """A job's profile in the shared CSV format (stage,instruction,frequency,time,energy)."""

    csv: str
    p_block_w: float


@dataclass(frozen=True)
class ProfileImport(JobMessage, wire_type="profile_import"):
    """Give a job its profile (CSV text; the daemon never opens a path): it skips profiling.

    Accepted before the job registers (it is used when it does) or while it profiles; `source` names the
    file in error messages.
    """

    csv: str
    source: str
    p_block_w: float
    """Blocking power (W); 0: the GPU model's own (measured or known)."""


@dataclass(frozen=True)
class ProfileImportOk(JobMessage, wire_type="profile_import_ok"):
    rows: int
    state: str

"""The job messages of the wire protocol (protocol 3 and later): registration, policies, the jobs table,
frontier, plan and profile documents, straggler announcements. `perseus_client.protocol` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from perseus_client.carbon_messages import CarbonInfo
from perseus_client.message import Message, Policy, Schedule


@dataclass(frozen=True)
class Register(Message):
    """Join a job with a leased GPU: this process runs `stage` of data-parallel pipeline `pipeline`."""

    TYPE: ClassVar[str] = "register"
    gpu: str
    job: str
    pipeline: int
    stage: int
    num_stages: int
    num_microbatches: int
    schedule: Schedule
    chunks: int
    """Model chunks (virtual stages) per GPU: > 1 only for the interleaved schedule."""


@dataclass(frozen=True)
class RegisterOk(Message):
    TYPE: ClassVar[str] = "register_ok"
    job: str
    state: str
    cached: bool
    """The job's profile and frontier came from the on-disk cache: no profiling, no solving."""


@dataclass(frozen=True)
class SetPolicy(Message):
    """Choose which frontier point a job runs (by its owner or an admin); takes effect at once."""

    TYPE: ClassVar[str] = "set_policy"
    job: str
    policy: Policy
    target: float
    """The slowdown fraction for "slowdown", seconds for "time", ignored otherwise."""


@dataclass(frozen=True)
class SetPolicyOk(Message):
    TYPE: ClassVar[str] = "set_policy_ok"
    job: str
    policy: str
    target: float


@dataclass(frozen=True)
class PipelineInfo:
    """One data-parallel pipeline of a job on this node."""

    pipeline: int
    stages_registered: int
    iterations: int
    iteration_time_s: float | None
    """Mean of the recent iterations (step begin to step begin of its first stage)."""
    compute_time_s: float | None
    """Median of the recent iterations' busy time: first step begin to last computation end of any of its
    stages, so waiting for other pipelines after the last computation (gradient sync) is left out."""
    plan_index: int | None
    """The frontier point this pipeline runs (None: no plan yet)."""
    plan_time_s: float | None
    plan_since_step: int | None
    """The step (iteration number of the step events) from which every stage runs this plan."""
    slowness: float | None
    """compute_time_s over plan_time_s: about 1 for a healthy pipeline, the factor for a straggler."""
    node: str
    """The node that runs it: "" for this node, else its cluster node name (from etcd)."""


@dataclass(frozen=True)
class StragglerInfo:
    """A job's straggler: which pipeline, by what factor, and who said so ("detected", "announced", or
    "cluster" for another node's detection or announcement)."""

    pipeline: int
    factor: float
    source: str
    since_step: int
    """The straggler pipeline's step when it was detected or announced (the others re-plan from then)."""


@dataclass(frozen=True)
class ProfilingInfo:
    """Online profiling progress: iterations so far, clocks measured out of those planned, energy spent."""

    iterations: int
    clocks_done: int
    clocks_total: int
    energy_j: float


@dataclass(frozen=True)
class JobInfo:
    """A job as `perseusctl jobs` shows it. Times in seconds; `plan_*` describe the deployed point."""

    job: str
    uid: int
    state: str
    state_for_s: float
    schedule: str
    num_stages: int
    num_microbatches: int
    chunks: int
    pipelines: tuple[PipelineInfo, ...]
    policy: str
    target: float
    cached: bool
    profiling: ProfilingInfo | None
    frontier_points: int
    plan_index: int | None
    plan_time_s: float | None
    plan_energy_j: float | None
    """Predicted: the deployed point's energy per iteration from the profile."""
    fastest_time_s: float | None
    clock_changes_per_iteration: float | None
    wrong_clock_fraction: float | None
    """Computations that began before their planned clock was applied, as a fraction of all planned."""
    error: str
    straggler: StragglerInfo | None
    target_time_s: float | None
    """The iteration time the other pipelines plan for while a straggler runs (None: no straggler)."""
    all_max_time_s: float | None
    all_max_energy_j: float | None
    """Predicted: all-max clocks' energy per iteration from the profile."""
    energy_saved_j: float
    """Energy saved against all-max clocks since the plan runs, all of this node's pipelines; measured or
    predicted as `energy_saved_source` says. Measured: (all-max energy per iteration, measured by the counters
    during profiling's first clock - energy per iteration measured while the plan runs) x iterations run.
    Predicted: from the profile (each iteration at the plan's energy vs all-max's, both waiting at blocking
    power until its time)."""
    cluster: str
    """The cluster plane's view of this job: "fresh", "stale", "expired", or "" without a cluster."""
    energy_saved_source: str = ""
    """"measured" (energy counters), "predicted" (profile), or "" before a plan runs."""
    measured_energy_j: float | None = None
    """Measured: energy per iteration while the plan runs, by the counters, this node's GPUs of the job."""
    measured_all_max_energy_j: float | None = None
    """Measured: energy per iteration at all-max clocks, by the counters during profiling's first clock."""
    carbon: CarbonInfo | None = None
    """The job's carbon so far (None: the node has no grid signal configured)."""


@dataclass(frozen=True)
class AnnounceStraggler(Message):
    """Announce (or with `clear`, withdraw) that `pipeline` of `job` straggles by `factor` (>= 1): its
    iterations take `factor` times its plan's time. The job's other pipelines move to the least-energy plan
    that is no slower than the straggler; shared with the job's other nodes when a cluster is configured."""

    TYPE: ClassVar[str] = "announce_straggler"
    job: str
    pipeline: int
    factor: float
    clear: bool


@dataclass(frozen=True)
class AnnounceStragglerOk(Message):
    TYPE: ClassVar[str] = "announce_straggler_ok"
    job: str
    pipeline: int
    factor: float
    clear: bool
    shared: bool
    """Whether the announcement goes to the cluster plane (etcd) too."""


@dataclass(frozen=True)
class JobsRequest(Message):
    TYPE: ClassVar[str] = "jobs"


@dataclass(frozen=True)
class JobsReply(Message):
    TYPE: ClassVar[str] = "jobs_ok"
    jobs: tuple[JobInfo, ...]


@dataclass(frozen=True)
class FrontierRequest(Message):
    TYPE: ClassVar[str] = "frontier"
    job: str


@dataclass(frozen=True)
class PlanRequest(Message):
    TYPE: ClassVar[str] = "plan"
    job: str


@dataclass(frozen=True)
class DocumentReply(Message):
    """A versioned JSON document (a `perseus-frontier` or `perseus-plan`, see docs/planner.md) as text."""

    TYPE: ClassVar[str] = "document"
    job: str
    document: str


@dataclass(frozen=True)
class ProfileExport(Message):
    TYPE: ClassVar[str] = "profile_export"
    job: str


@dataclass(frozen=True)
class ProfileReply(Message):
    """A job's profile in the shared CSV format (stage,instruction,frequency,time,energy)."""

    TYPE: ClassVar[str] = "profile"
    job: str
    csv: str
    p_block_w: float


@dataclass(frozen=True)
class ProfileImport(Message):
    """Give a job its profile (CSV text; the daemon never opens a path): it skips profiling.

    Accepted before the job registers (it is used when it does) or while it profiles; `source` names the
    file in error messages.
    """

    TYPE: ClassVar[str] = "profile_import"
    job: str
    csv: str
    source: str
    p_block_w: float
    """Blocking power (W); 0: the GPU model's own (measured or known)."""


@dataclass(frozen=True)
class ProfileImportOk(Message):
    TYPE: ClassVar[str] = "profile_import_ok"
    job: str
    rows: int
    state: str

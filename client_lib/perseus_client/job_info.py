"""The jobs table of the wire protocol: a job as `perseusctl jobs` and `status` show it, its pipelines,
straggler and profiling progress. `perseus_client.protocol` and `job_messages` re-export them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.carbon_messages import CarbonInfo
from perseus_client.version import since


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
class PlanningInfo:
    """From profiling done to the plan deployed (s), by phase: the solver worker's (the cost models' fit, the
    frontier, following every point under the clock-switch latency, the switch-aware descent) and the rest
    (`transfer_s`: waiting for the worker, moving the frontier to the daemon, installing the plan)."""

    total_s: float
    fit_s: float
    frontier_s: float
    follow_s: float
    descent_s: float
    transfer_s: float


@dataclass(frozen=True)
class SpanMember:
    """One node of a job whose pipelines span nodes, as its record in etcd says."""

    node: str
    stages: str
    """The (pipeline, stage) slots it runs, `p0:s0-3 p1:s4`."""
    state: str
    """Its job's state there."""
    profiling_iterations: int
    measured_energy_j: float | None
    """Energy per iteration of its GPUs of the job while the plan runs, by their counters."""
    measured_all_max_energy_j: float | None
    """Energy per iteration of its GPUs at all-max clocks (profiling's first clock), by their counters."""


@dataclass(frozen=True)
class SpanInfo:
    """A job whose pipelines span nodes: who takes part, who solves, what this node cannot see."""

    node: str
    """This node's cluster name."""
    leader: str
    """The node that solves and re-plans the job ("" while none holds the role)."""
    members: tuple[SpanMember, ...]
    missing: str
    """What the job lacks that this node can see is missing ("" when nothing): stages no node registered,
    a conflicting registration, a cluster view that is stale or expired."""
    view: str
    """The cluster view: "fresh", "stale" or "expired" (then plans keep running and re-plans wait)."""
    solves: int
    """Frontiers solved for the job (one per job; again only when the solving node died before sharing)."""
    plan_epoch: int
    """The leader's plan decisions so far (the first deployment and each re-plan)."""
    measured_energy_j: float | None
    """The whole job's energy per iteration under the plan (every member's GPUs), None until all report."""
    measured_all_max_energy_j: float | None
    """The whole job's energy per iteration at all-max clocks, None until every member reports."""


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
    carbon: CarbonInfo | None = since(1, None)
    """The job's carbon so far (None: the node has no grid signal configured)."""
    plan_note: str = since(3, "")
    """Why the running plan differs from its frontier point: under `no_slowdown`, stages whose plan would
    save no more than its uncertainty plus its clock changes run one clock instead ("" when none do)."""
    planning: PlanningInfo | None = since(3, None)
    """How long its plan took from profiling done to deployed (None: not solved here, or not deployed yet)."""
    stage_gpus: int = since(4, 1)
    """GPUs per stage (tensor x context parallel), profiled, planned and switched together."""
    span: SpanInfo | None = since(4, None)
    """Set for a job whose pipelines span nodes (coordinated through etcd); None for a job on one node."""
    profile_error_pct: float | None = since(7, None)
    """The profile's estimated error: RMS of its energies' relative standard errors, % (None: not known,
    as for an imported or cached profile)."""
    predicted_saving_pct: float | None = since(7, None)
    """The running plan's saving against all-max, predicted from the profile (%)."""
    measured_saving_pct: float | None = since(7, None)
    """The same as the counters measured it (None until both energies are measured)."""
    saving_error_pts: float | None = since(7, None)
    """How far the measured saving may lie below the prediction from the profile's error alone (points); a
    larger shortfall re-plans the job once."""
    accuracy_action: str = since(7, "")
    """"re-planned" (measured saving fell short by more than the error), "kept" (still short after the
    re-plan), or "" (within the error, or not judged yet)."""

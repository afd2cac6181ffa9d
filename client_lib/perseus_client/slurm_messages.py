"""Slurm messages of the wire protocol (minor 5): a Slurm job's GPU energy as the daemon measured it, and the
prolog/epilog pair that opens and closes a job's record (admin socket). `perseus_client.protocol` registers
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import Message


@dataclass(frozen=True)
class SlurmJobEnergy:
    """One Slurm job's GPU energy on this node."""

    job: int
    uid: int
    """The job's owner (the prolog's SLURM_JOB_UID, else the uid of the processes that leased its GPUs)."""
    state: str
    """"running" (prolog seen or a lease held, no epilog yet) or "ended" (epilog seen)."""
    gpus: tuple[str, ...]
    """The GPUs the job was allocated (from its prolog) or leased, by UUID."""
    leased_energy_j: float
    """Energy of the GPUs while processes of the job held their leases (claim to release or death)."""
    allocated_energy_j: float | None
    """Energy of the job's allocated GPUs from prolog to epilog (or now); None without a prolog."""
    duration_s: float
    """Prolog (or first lease) to epilog (or now)."""
    leases: int
    """Leases its processes took."""
    released_at_end: tuple[str, ...]
    """GPUs the epilog found still leased by the job (a killed job's leftovers) and restored."""
    source: str
    """Where the job id of its processes came from: "cgroup" (slurmd's), "environment" (a hint), or
    "prolog" while no process of the job has leased a GPU."""


@dataclass(frozen=True)
class SlurmJobsRequest(Message, wire_type="slurm_jobs", since=5):
    """The Slurm jobs this caller may see (its own; an admin's: all), newest first."""


@dataclass(frozen=True)
class SlurmJobsReply(Message, wire_type="slurm_jobs_ok", since=5):
    jobs: tuple[SlurmJobEnergy, ...]


@dataclass(frozen=True)
class AdminSlurmProlog(Message, wire_type="admin_slurm_prolog", since=5):
    """From the job's prolog (slurmd, root): job `job` of `uid` is allocated GPUs `gpu_minors` here (the
    minors of their /dev/nvidia<N> nodes, as SLURM_JOB_GPUS names them with gres.conf's File=/dev/nvidia<N>).
    Processes of the job may then claim only those GPUs."""

    job: int
    uid: int
    gpu_minors: tuple[int, ...]


@dataclass(frozen=True)
class AdminSlurmEpilog(Message, wire_type="admin_slurm_epilog", since=5):
    """From the job's epilog: the job ended; release (and restore) whatever its processes still lease, close
    its record and return it."""

    job: int


@dataclass(frozen=True)
class SlurmJobOk(Message, wire_type="slurm_job_ok", since=5):
    record: SlurmJobEnergy

"""Slurm jobs' GPU energy on this node, and their prolog/epilog (docs/slurm.md).

A process that leases a GPU belongs to the Slurm job its cgroup names (slurmd's `.../job_<id>/...`, which the
process cannot leave), else the job its environment says (`SLURM_JOB_ID`, a hint). The energy each GPU's
counter advanced while the job's processes held its lease is the job's leased energy. The job's prolog (run by
slurmd as root, `perseusctl slurm prolog`) declares the GPUs Slurm allocated it: from then on the job's
processes may claim only those, and their energy from prolog to epilog is the job's allocated energy. The
epilog (`perseusctl slurm epilog`) releases and restores whatever the job's processes still lease (a killed
job's leftovers), closes the record and returns it. The last `MAX_ENDED` ended jobs are kept.

Runs on the daemon's main thread; energy is read through the GPUs' owner threads.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perseus_client.protocol import SlurmJobEnergy

from perseusd.errors import LimitReachedError, NotPermittedError
from perseusd.gpu.backend import gpu_minor
from perseusd.gpu.registry import GpuRegistry, UnknownGpuError
from perseusd.leasing.leases import Session

logger = logging.getLogger(__name__)

MAX_ENDED = 64
MAX_RUNNING = 4096
READ_TIMEOUT_S = 2.0


@dataclass
class _Record:
    job: int
    uid: int
    source: str
    started_s: float
    gpus: list[str] = field(default_factory=list)
    ended_s: float | None = None
    leased_mj: int = 0
    open_mj: dict[str, int] = field(default_factory=dict)
    """GPU -> its counter when the job's lease on it began (leases still held)."""
    allocated_from_mj: dict[str, int] | None = None
    allocated_mj: int | None = None
    leases: int = 0
    released: tuple[str, ...] = ()


class SlurmLedger:
    """Every Slurm job seen on this node: its GPUs, leases and energy."""

    def __init__(self, registry: GpuRegistry, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self._clock_s = clock_s
        self._running: dict[int, _Record] = {}
        self._ended: OrderedDict[int, _Record] = OrderedDict()
        self._lease_job: dict[str, int] = {}
        """GPU -> the Slurm job whose process leases it."""

    # ------------------------------------------------------------------ GPUs a job may use

    def allowed(self, job: int | None) -> frozenset[str] | None:
        """The GPUs job `job`'s prolog declared (None: no prolog, no restriction)."""
        record = self._running.get(job) if job is not None else None
        if record is None or record.allocated_from_mj is None:
            return None
        return frozenset(record.gpus)

    def check_claim(self, session: Session, gpus: Sequence[str]) -> None:
        allowed = self.allowed(session.slurm_job)
        if allowed is None:
            return
        for gpu in gpus:
            if gpu not in allowed:
                raise NotPermittedError(
                    f"GPU {gpu} is not allocated to Slurm job {session.slurm_job} on this node "
                    f"(its prolog declared {', '.join(sorted(allowed)) or 'none'})",
                )

    # ------------------------------------------------------------------ leases

    def leased(self, session: Session, gpus: Sequence[str]) -> None:
        """Processes of a Slurm job took leases on `gpus`: their energy counts for the job from now."""
        job = session.slurm_job
        if job is None:
            return
        placement = session.placement
        source = placement.slurm_job_source if placement is not None else ""
        record = self._running.get(job)
        if record is None:
            record = self._open(job, session.caller.uid, source)
        elif record.source == "prolog" and source:
            record.source = source  # how its processes were known to be the job's
        for gpu in gpus:
            if self._lease_job.get(gpu) == job:
                continue  # a re-claim of a GPU it holds
            self._lease_job[gpu] = job
            record.open_mj[gpu] = self._read_mj(gpu)
            record.leases += 1
            if gpu not in record.gpus:
                record.gpus.append(gpu)

    def lease_ended(self, gpu: str) -> None:
        """A lease ended (release, the holder's death, an admin reset): close its share of the job."""
        job = self._lease_job.pop(gpu, None)
        record = None if job is None else (self._running.get(job) or self._ended.get(job))
        if record is None:
            return
        began_mj = record.open_mj.pop(gpu, None)
        if began_mj is not None:
            record.leased_mj += max(0, self._read_mj(gpu) - began_mj)

    # ------------------------------------------------------------------ prolog and epilog

    def prolog(self, job: int, uid: int, minors: Sequence[int]) -> SlurmJobEnergy:
        by_minor = {gpu_minor(info): info.uuid for info in self._registry.infos()}
        unknown = [m for m in minors if m not in by_minor]
        if unknown:
            raise UnknownGpuError(
                f"Slurm job {job}: no GPU /dev/nvidia{unknown[0]} on this node (SLURM_JOB_GPUS names the "
                "minors of /dev/nvidia<N>: check gres.conf's File=)",
            )
        record = self._running.get(job) or self._open(job, uid, "prolog")
        record.uid = uid
        record.gpus = [by_minor[m] for m in sorted(set(minors))]
        record.allocated_from_mj = {gpu: self._read_mj(gpu) for gpu in record.gpus}
        logger.info("Slurm job %d (uid %d): GPUs %s", job, uid, ", ".join(record.gpus) or "none")
        return self._view(record)

    def epilog(self, job: int, release: Callable[[list[str]], tuple[str, ...]]) -> SlurmJobEnergy:
        """Close job `job`: `release` drops and restores the GPUs its processes still lease."""
        record = self._running.get(job)
        if record is None:
            ended = self._ended.get(job)
            if ended is not None:
                return self._view(ended)  # a second epilog (slurmd retries): the same record
            record = self._open(job, 0, "prolog")
        still = sorted(gpu for gpu, holder in self._lease_job.items() if holder == job)
        record.released = release(still) if still else ()
        for gpu in still:  # release() ended them through lease_ended already, unless it could not
            if self._lease_job.get(gpu) == job:
                self.lease_ended(gpu)
        if record.allocated_from_mj is not None:
            record.allocated_mj = sum(
                max(0, self._read_mj(gpu) - began) for gpu, began in record.allocated_from_mj.items()
            )
        record.ended_s = self._clock_s()
        del self._running[job]
        self._ended[job] = record
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)
        view = self._view(record)
        logger.info(
            "Slurm job %d ended: %.1f J leased, %s J allocated, released %s",
            job,
            view.leased_energy_j,
            "-" if view.allocated_energy_j is None else f"{view.allocated_energy_j:.1f}",
            list(record.released) or "nothing",
        )
        return view

    # ------------------------------------------------------------------ views

    def records(self, uid: int | None = None) -> tuple[SlurmJobEnergy, ...]:
        """Running then ended jobs, newest first (those of `uid` only, unless None)."""
        every = [*reversed(self._running.values()), *reversed(self._ended.values())]
        return tuple(self._view(r) for r in every if uid is None or r.uid == uid)

    def _open(self, job: int, uid: int, source: str) -> _Record:
        if len(self._running) >= MAX_RUNNING:
            raise LimitReachedError(f"{MAX_RUNNING} Slurm jobs open: are epilogs configured?")
        self._ended.pop(job, None)  # a job id Slurm reused after a restart
        record = _Record(job=job, uid=uid, source=source, started_s=self._clock_s())
        self._running[job] = record
        return record

    def _view(self, record: _Record) -> SlurmJobEnergy:
        leased_mj = record.leased_mj + sum(
            max(0, self._read_mj(gpu) - began) for gpu, began in record.open_mj.items()
        )
        allocated_mj = record.allocated_mj
        if allocated_mj is None and record.allocated_from_mj is not None:
            allocated_mj = sum(
                max(0, self._read_mj(gpu) - began) for gpu, began in record.allocated_from_mj.items()
            )
        end_s = record.ended_s if record.ended_s is not None else self._clock_s()
        return SlurmJobEnergy(
            job=record.job,
            uid=record.uid,
            state="running" if record.ended_s is None else "ended",
            gpus=tuple(record.gpus),
            leased_energy_j=leased_mj / 1000.0,
            allocated_energy_j=None if allocated_mj is None else allocated_mj / 1000.0,
            duration_s=round(end_s - record.started_s, 3),
            leases=record.leases,
            released_at_end=record.released,
            source=record.source,
        )

    def _read_mj(self, gpu: str) -> int:
        """The GPU's energy counter (mJ); 0 when it cannot be read (the job's energy then undercounts)."""
        try:
            return self._registry.submit_read_energy(gpu).result(timeout=READ_TIMEOUT_S)[1]
        except Exception as exc:
            logger.warning("Slurm energy: GPU %s counter unreadable: %s", gpu, exc)
            return 0

"""Job requests of the control socket: register, policy, and reading jobs, frontiers, plans and profiles.

A job belongs to the user who registered it: only that user (or an admin) may read or change it; other
users do not see it in `jobs`, and every request naming it is refused alike (`JobOwnerError`, mapped to
PERMISSION_DENIED by `wire_errors`). Profiles arrive as CSV text and are parsed strictly (file, line and
column in the error); no path from a request is ever opened.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

from perseus_client.protocol import (
    PROTOCOL_MINOR,
    AnnounceStraggler,
    AnnounceStragglerOk,
    DocumentReply,
    ErrorCode,
    FrontierRequest,
    JobInfo,
    JobsReply,
    JobsRequest,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    ProfileImportOk,
    ProfileReply,
    ProtocolError,
    Register,
    RegisterOk,
    SetPolicy,
    SetPolicyOk,
)

from perseusd.daemon.past_jobs import PastJobs
from perseusd.errors import PerseusError
from perseusd.jobs.job import Job
from perseusd.jobs.manager import JobManager, check_owner
from perseusd.jobs.registration import PendingImport
from perseusd.jobs.report import document_text, job_info
from perseusd.jobs.shape import MAX_PIPELINE
from perseusd.jobs.states import ENDED, FAILED
from perseusd.leasing.identity import Caller
from perseusd.leasing.leases import LeaseBook
from perseusd.planner.policy import Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints, profile_to_csv, read_profile_waiting
from perseusd.switching.plans import PlanBook

CARBON_SINCE_MINOR = 1
"""The protocol minor that added the `carbon` policy."""
MAX_PENDING_IMPORTS_PER_USER = 16
"""Profiles one user may have waiting for jobs not registered yet; each user has their own namespace."""
MAX_P_BLOCK_W = 10_000.0
"""The largest blocking power a profile import may give (W): far above any GPU's."""


@dataclass(eq=False)
class JobRequests:
    """The job requests, for callers the IPC layer identified."""

    manager: JobManager
    plans: PlanBook
    leases: LeaseBook
    is_admin: Callable[[Caller], bool]
    protocol_minor: int = PROTOCOL_MINOR
    """The newest minor this daemon speaks: values newer than it are refused like newer fields."""
    past: PastJobs | None = None
    """Ended and failed jobs kept across restarts (None: this run's only, as the manager keeps them)."""

    def register(self, caller: Caller, message: Register) -> RegisterOk:
        self.leases.require_lease(caller, message.gpu)
        return self.manager.register(caller.uid, caller.pid, message)

    def set_policy(self, caller: Caller, message: SetPolicy) -> SetPolicyOk:
        if message.policy == "carbon" and self.protocol_minor < CARBON_SINCE_MINOR:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"policy carbon needs protocol 6.{CARBON_SINCE_MINOR}; this daemon speaks "
                f"6.0-6.{self.protocol_minor}",
            )
        job = self._active_job(caller, message.job)
        policy = Policy(message.policy, message.target)
        self.manager.set_policy(job, policy)
        return SetPolicyOk(job=job.name, policy=policy.name, target=policy.target)

    def announce_straggler(self, caller: Caller, message: AnnounceStraggler) -> AnnounceStragglerOk:
        job = self._active_job(caller, message.job)
        if not 0 <= message.pipeline <= MAX_PIPELINE:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"the pipeline must be 0..{MAX_PIPELINE}")
        pipelines = sorted({slot.pipeline for slot in job.slots.values()})
        if job.span is None and message.pipeline not in pipelines:  # a spanning job's may be elsewhere
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"job {job.name} has no pipeline {message.pipeline} (its pipelines: "
                f"{', '.join(map(str, pipelines)) or 'none'})",
            )
        factor = None if message.clear else message.factor
        shared = self.manager.response.announce(job, message.pipeline, factor)
        return AnnounceStragglerOk(
            job=job.name, pipeline=message.pipeline, factor=factor or 0.0, clear=message.clear, shared=shared
        )

    def jobs(self, caller: Caller, _message: JobsRequest) -> JobsReply:
        return JobsReply(jobs=self.visible_jobs(caller))

    def visible_jobs(self, caller: Caller) -> tuple[JobInfo, ...]:
        """The caller's jobs (an admin's: every job), the previous runs' ended ones first, then this run's."""
        admin = self.is_admin(caller)
        past = () if self.past is None else self.past.shown(lambda job: admin or job.uid == caller.uid)
        jobs = self.manager.jobs.values()
        return past + tuple(self._info(j) for j in jobs if admin or j.uid == caller.uid)

    def record_ended(self) -> None:
        """Keep the record of every job that ended or failed since the last call (`PastJobs`)."""
        if self.past is None:
            return
        for job in self.manager.jobs.values():
            key = (job.name, job.uid, job.state_since_s)  # the moment it ended: one record per ending
            if job.state in (ENDED, FAILED) and not self.past.known(key):
                self.past.record(key, self._info(job))

    def _info(self, job: Job) -> JobInfo:
        manager = self.manager
        return job_info(
            job, self.plans, manager.measured(job), manager.carbon.info(job), manager.profiling_energy_j(job)
        )

    def frontier(self, caller: Caller, message: FrontierRequest) -> DocumentReply:
        job = self._own_job(caller, message.job)
        doc = job.frontier_document()
        if doc is None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"job {job.name} has no frontier yet (it is {job.state})"
            )
        return DocumentReply(job=job.name, document=document_text(doc))

    def plan(self, caller: Caller, message: PlanRequest) -> DocumentReply:
        job = self._own_job(caller, message.job)
        doc = job.plan_document()
        if doc is None:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"job {job.name} runs no plan yet (it is {job.state})")
        return DocumentReply(job=job.name, document=document_text(doc))

    def profile_export(self, caller: Caller, message: ProfileExport) -> ProfileReply:
        job = self._own_job(caller, message.job)
        if job.profile is None:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"job {job.name} has no profile yet (it is {job.state})")
        csv = profile_to_csv(job.profile, job.waiting_w)
        return ProfileReply(job=job.name, csv=csv, p_block_w=job.p_block_w)

    def profile_import(self, caller: Caller, message: ProfileImport) -> ProfileImportOk:
        if not 0 <= message.p_block_w <= MAX_P_BLOCK_W:  # the decoder refused NaN and infinities
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"the blocking power (--p-block-w, p_block_w) must be 0..{MAX_P_BLOCK_W:g} W",
            )
        profile, waiting_w = _parse_profile(message.csv, message.source or "<import>")
        job = self.manager.jobs.get(message.job)
        if job is None or not job.active:
            return self._pending_import(caller, message, profile, waiting_w)
        check_owner(job, caller.uid, admin=self.is_admin(caller))
        _check_stages(job, profile)
        p_block_w = message.p_block_w or job.p_block_w
        if p_block_w <= 0:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                "give the GPU's power while blocked on communication (--p-block-w, p_block_w): nothing "
                "measured yet",
            )
        self.manager.reprofile_with(job, profile, p_block_w, waiting_w)
        return ProfileImportOk(job=job.name, rows=len(profile.measurements), state=job.state)

    def _pending_import(
        self, caller: Caller, message: ProfileImport, profile: Profile, waiting_w: WaitingPoints
    ) -> ProfileImportOk:
        """Keep the profile for the caller's job of that name: keyed by (uid, job), so no user can replace
        or block another user's; a user's own re-import replaces theirs."""
        pending = self.manager.pending_imports
        key = (caller.uid, message.job)
        mine = sum(1 for uid, _ in pending if uid == caller.uid)
        if key not in pending and mine >= MAX_PENDING_IMPORTS_PER_USER:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"you have {mine} profiles waiting for their jobs (the most per user is "
                f"{MAX_PENDING_IMPORTS_PER_USER}); register those jobs first",
            )
        if message.p_block_w <= 0:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                "a profile imported before its job registers needs the GPU's power while blocked on "
                "communication (--p-block-w, p_block_w > 0)",
            )
        pending[key] = PendingImport(profile, message.p_block_w, waiting_w)
        return ProfileImportOk(job=message.job, rows=len(profile.measurements), state="pending")

    def _active_job(self, caller: Caller, name: str) -> Job:
        """The caller's job, refused when it has ended or failed: a change to it would take no effect."""
        job = self._own_job(caller, name)
        if not job.active:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"job {job.name} has {job.state}: nothing of it can change any more"
            )
        return job

    def _own_job(self, caller: Caller, name: str) -> Job:
        return self.manager.job_for(caller.uid, name, admin=self.is_admin(caller))


def _parse_profile(text: str, source: str) -> tuple[Profile, WaitingPoints]:
    try:
        return read_profile_waiting(io.StringIO(text), source)
    except PerseusError as exc:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"profile_import: {exc}") from None


def _check_stages(job: Job, profile: Profile) -> None:
    needed = job.shape.num_stages * job.shape.chunks
    if profile.num_stages != needed:
        raise ProtocolError(
            ErrorCode.BAD_FIELD,
            f"profile_import: the profile has {profile.num_stages} stages, job {job.name} needs {needed}",
        )

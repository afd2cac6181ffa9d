"""The client's control calls: those that change something (fail-open) and those that ask (raise unanswered).

`ControlCalls` is the part of `PerseusClient` (`perseus_client.client`) that sends control requests on its
connection (`perseus_client.connection`). A call that changes something (hello, claim, release, set_clock,
set_plan, clear_plan, register, set_policy, profile_import, announce/clear_straggler) logs a warning and
returns None (claim: (), set_plan: 0, clear_plan: False) when the daemon is out of reach or refuses, and is
counted in `calls_skipped`; strict, it raises `PerseusClientError`. What it asked is remembered for a new
daemon (`perseus_client.session`). A call that asks for something (status, jobs, frontier, plan,
profile_export, event_count) raises `PerseusClientError`: there is no answer to return. Arguments that are
wrong whatever the daemon says raise `ValueError` before anything is sent.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from perseus_client.connection import ClientConnection
from perseus_client.link import PerseusClientError
from perseus_client.protocol import (
    AnnounceStraggler,
    AnnounceStragglerOk,
    Claim,
    ClaimOk,
    ClearPlan,
    ClearPlanOk,
    DocumentReply,
    EventCount,
    EventCountOk,
    FrontierRequest,
    HelloOk,
    JobsReply,
    JobsRequest,
    PlanEntry,
    PlanRequest,
    ProfileExport,
    ProfileImport,
    ProfileImportOk,
    ProfileReply,
    Register,
    RegisterOk,
    Release,
    ReleaseOk,
    SetClock,
    SetClockOk,
    SetPlan,
    SetPlanOk,
    SetPolicy,
    SetPolicyOk,
    StatusReply,
    StatusRequest,
)

logger = logging.getLogger(__name__)

R = TypeVar("R")


class ControlCalls(ClientConnection):
    """The control calls of a client: one request and its reply each, under the client's lock."""

    # ------------------------------------------------------------------ calls that change something

    def hello(self) -> HelloOk | None:
        """Register this process; the reply says which GPUs the daemon has and the protocol it speaks (from
        then on this client writes the older of the two minors)."""
        return self._act("hello", self._open)

    def claim(self, gpus: Sequence[str]) -> tuple[str, ...]:
        """Lease GPUs (by UUID) for this process; all or nothing. Fail-open: () when not done now (claimed
        when the daemon is back, if it was out of reach)."""
        wanted = tuple(gpus)
        request = Claim(gpus=wanted, job=self.job)
        reply = self._act("claim", lambda: self._call(request, ClaimOk), lambda: self._memory.claim(wanted))
        return () if reply is None else reply.gpus

    def release(self, gpus: Sequence[str] = ()) -> ReleaseOk | None:
        """Release leases (all of them by default); the daemon restores the GPUs. Never claimed again."""
        self._memory.forget_gpus(gpus or list(self._memory.claimed))
        return self._act("release", lambda: self._call(Release(gpus=tuple(gpus)), ReleaseOk))

    def set_clock(self, gpu: str, sm_clock_mhz: int | None) -> int | None:
        """Lock the SM clock of a leased GPU (None unlocks); returns the clock applied (MHz)."""
        request = SetClock(gpu=gpu, sm_clock_mhz=sm_clock_mhz)
        reply = self._act("set_clock", lambda: self._call(request, SetClockOk))
        return None if reply is None else reply.applied_mhz

    def set_plan(self, gpu: str, plan: Sequence[PlanEntry | Mapping[str, Any]]) -> int:
        """Deploy a clock plan on a leased GPU: its computations in schedule order, each with `freq_mhz`.

        Entries are `PlanEntry` or mappings with instruction, microbatch, chunk and freq_mhz. From now on the
        daemon sets each computation's clock as the previous one ends. Returns the number of computations
        (0 when not done now).
        """
        entries = tuple(_plan_entry(entry) for entry in plan)
        plans = self._memory.plans
        request = SetPlan(gpu=gpu, plan=entries)
        reply = self._act(
            "set_plan", lambda: self._call(request, SetPlanOk), lambda: plans.update({gpu: entries})
        )
        return 0 if reply is None else reply.computations

    def clear_plan(self, gpu: str) -> bool:
        """Remove a GPU's plan (its clock stays as it is); returns whether there was one."""
        self._memory.plans.pop(gpu, None)
        reply = self._act("clear_plan", lambda: self._call(ClearPlan(gpu=gpu), ClearPlanOk))
        return reply is not None and reply.cleared

    def register(
        self,
        gpu: str,
        *,
        stage: int,
        num_stages: int,
        num_microbatches: int,
        schedule: str = "1f1b",
        pipeline: int = 0,
        chunks: int = 1,
        job: str | None = None,
        stage_gpus: int = 1,
        run: str = "",
    ) -> RegisterOk | None:
        """Join job `job` (default: this client's job) with a GPU this process claimed.

        From now on the daemon profiles, plans and switches this GPU's clocks by itself; send step and
        computation events. `schedule` is "1f1b", "gpipe", "interleaved" (with `chunks` > 1) or "observed".
        `stage_gpus`: the GPUs that run this stage together (tensor x context parallel; each registers the
        same `pipeline` and `stage`). `run`: an id all processes of this run share (the launcher's job id),
        so that a job's stages on several nodes are told apart from another run of the same name.
        Fail-open: None when not done now (registered when the daemon is back, if it was out of reach).
        """
        request = Register(
            gpu=gpu,
            job=job or self.job,
            pipeline=pipeline,
            stage=stage,
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            schedule=schedule,  # type: ignore[arg-type]  # checked by the daemon
            chunks=chunks,
            stage_gpus=stage_gpus,
            run=run,
        )
        registrations = self._memory.registrations
        remember = lambda: registrations.update({gpu: request})  # noqa: E731
        return self._act("register", lambda: self._call(request, RegisterOk), remember)

    def set_policy(self, policy: str, target: float = 0.0, job: str | None = None) -> SetPolicyOk | None:
        """Choose the frontier point a job runs: fastest, slowdown (target fraction), time (s), min_energy."""
        request = SetPolicy(job=job or self.job, policy=policy, target=target)  # type: ignore[arg-type]
        remember = lambda: self._memory.policies.update({request.job: request})  # noqa: E731
        return self._act("set_policy", lambda: self._call(request, SetPolicyOk), remember)

    def profile_import(
        self, csv_text: str, *, source: str = "<memory>", p_block_w: float = 0.0, job: str | None = None
    ) -> ProfileImportOk | None:
        """Give a job its profile so it skips profiling (before it registers, or while it profiles). A new
        daemon that does not find the job in its cache is given it again."""
        request = ProfileImport(job=job or self.job, csv=csv_text, source=source, p_block_w=p_block_w)
        remember = lambda: self._memory.imports.update({request.job: request})  # noqa: E731
        return self._act("profile_import", lambda: self._call(request, ProfileImportOk), remember)

    def announce_straggler(
        self, pipeline: int, factor: float, job: str | None = None
    ) -> AnnounceStragglerOk | None:
        """Tell the daemon that data-parallel `pipeline` of a job is slow by `factor` (>= 1, e.g. 1.2).

        For what the daemon cannot see in time from the step events: a replica known to be slow from outside
        (thermal throttling or a degraded link reported by the cluster's health checks). Its iterations are
        taken to last `factor` times its plan's time, and the job's other pipelines move to the least-energy
        plan that is no slower; the reply's `shared` says whether the job's other nodes hear of it (etcd).
        The job's owner or an admin may announce; `job` defaults to this client's job.
        """
        _check_pipeline(pipeline)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1.0:
            raise ValueError(f"straggler factor must be a number >= 1, e.g. 1.2 (got {factor!r})")
        if not math.isfinite(factor):
            raise ValueError(f"straggler factor must be finite (got {factor!r})")
        request = AnnounceStraggler(job=job or self.job, pipeline=pipeline, factor=float(factor), clear=False)
        return self._act("announce_straggler", lambda: self._call(request, AnnounceStragglerOk))

    def clear_straggler(self, pipeline: int, job: str | None = None) -> AnnounceStragglerOk | None:
        """Withdraw an announced straggler: the job's other pipelines go back to their own policy's plan."""
        _check_pipeline(pipeline)
        request = AnnounceStraggler(job=job or self.job, pipeline=pipeline, factor=1.0, clear=True)
        return self._act("clear_straggler", lambda: self._call(request, AnnounceStragglerOk))

    def _act(self, what: str, call: Callable[[], R], remember: Callable[[], None] | None = None) -> R | None:
        """Run a call that changes something. Done: remembered for a new daemon. Out of reach: remembered too
        (fail-open: None). Refused: not remembered (fail-open: a warning and None). Strict: raises."""
        try:
            result = call()
        except PerseusClientError as exc:
            if exc.lost_link:
                self._went_away(exc)
                if remember is not None:
                    remember()
            if self.strict:
                raise
            self.calls_skipped += 1
            if not exc.lost_link:
                logger.warning("perseus: the daemon refused %s: %s; training goes on", what, exc)
            return None
        if remember is not None:
            remember()
        return result

    # ------------------------------------------------------------------ calls that ask (raise unanswered)

    def status(self) -> StatusReply:
        return self._call(StatusRequest(), StatusReply)

    def jobs(self) -> JobsReply:
        return self._call(JobsRequest(), JobsReply)

    def frontier(self, job: str | None = None) -> dict[str, Any]:
        """The job's frontier as a `perseus-frontier` document (parsed JSON)."""
        reply = self._call(FrontierRequest(job=job or self.job), DocumentReply)
        return dict(json.loads(reply.document))

    def plan(self, job: str | None = None) -> dict[str, Any]:
        """The job's deployed plan as a `perseus-plan` document (parsed JSON)."""
        reply = self._call(PlanRequest(job=job or self.job), DocumentReply)
        return dict(json.loads(reply.document))

    def profile_export(self, job: str | None = None) -> ProfileReply:
        """The job's measured profile as CSV text, and its blocking power."""
        return self._call(ProfileExport(job=job or self.job), ProfileReply)

    def event_count(self) -> EventCountOk:
        """How many of this process's events the daemon has read, and how many of those it dropped."""
        return self._call(EventCount(), EventCountOk)


def _check_pipeline(pipeline: int) -> None:
    """Pipelines are numbered from 0 (the `pipeline` given to `register`)."""
    if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 0:
        raise ValueError(f"pipeline must be an integer >= 0, as given to register() (got {pipeline!r})")


def _plan_entry(entry: PlanEntry | Mapping[str, Any]) -> PlanEntry:
    if isinstance(entry, PlanEntry):
        return entry
    try:
        return PlanEntry(
            instruction=entry["instruction"],
            microbatch=entry["microbatch"],
            chunk=entry.get("chunk", 0),
            freq_mhz=entry["freq_mhz"],
        )
    except (KeyError, TypeError) as exc:
        raise PerseusClientError("BAD_FIELD", f"bad plan entry {entry!r}: {exc}") from None

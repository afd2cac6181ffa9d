"""What a client asked of the daemon that a new daemon must be told again (restart, upgrade, late start).

A client remembers the GPUs it claimed, the plans it set, the stages it registered, the profiles it imported
and the policies it chose, including those asked while the daemon was away (fail-open: the calls were
skipped). When it (re)opens a session, `replay` sends them again in the order the daemon needs: claims, plans,
registrations, then the profiles of jobs that must not profile again (only where the daemon did not find the
job in its cache: an import would make it solve again), then policies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol, TypeVar

from perseus_client.codes import JobState
from perseus_client.link import PerseusClientError
from perseus_client.protocol import (
    Claim,
    ClaimOk,
    Message,
    PlanEntry,
    ProfileImport,
    ProfileImportOk,
    Register,
    RegisterOk,
    SetPlan,
    SetPlanOk,
    SetPolicy,
    SetPolicyOk,
)

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class Call(Protocol):
    """The client's control call: a request and the type of its reply."""

    def __call__(self, request: Message, expected: type[M]) -> M: ...


_NEEDS_PROFILE = frozenset((JobState.REGISTERED, JobState.PROFILING))


class SessionMemory:
    """The requests to replay, by what they are about (the latest of each wins)."""

    def __init__(self) -> None:
        self.claimed: list[str] = []
        self.plans: dict[str, tuple[PlanEntry, ...]] = {}
        self.registrations: dict[str, Register] = {}
        self.imports: dict[str, ProfileImport] = {}
        self.policies: dict[str, SetPolicy] = {}

    def claim(self, gpus: Iterable[str]) -> None:
        for gpu in gpus:
            if gpu not in self.claimed:
                self.claimed.append(gpu)

    def forget_gpus(self, gpus: Iterable[str]) -> None:
        """Released GPUs: not claimed again, their plans and registrations gone."""
        released = set(gpus)
        self.claimed = [gpu for gpu in self.claimed if gpu not in released]
        for gpu in released:
            self.plans.pop(gpu, None)
            self.registrations.pop(gpu, None)

    @property
    def empty(self) -> bool:
        return not (self.claimed or self.plans or self.registrations or self.imports or self.policies)

    def replay(self, call: Call, job: str) -> str:
        """Send everything again; returns a summary for the log. A lost link raises (the caller retries
        later); a refusal is logged and the rest goes on."""
        registered: dict[str, RegisterOk] = {}
        if self.claimed:
            _refusable(call, Claim(gpus=tuple(self.claimed), job=job), ClaimOk)
        for gpu, plan in list(self.plans.items()):
            _refusable(call, SetPlan(gpu=gpu, plan=plan), SetPlanOk)
        for request in list(self.registrations.values()):
            reply = _refusable(call, request, RegisterOk)
            if reply is not None:
                registered[reply.job] = reply
        imported = 0
        for name, profile in list(self.imports.items()):
            joined = registered.get(name)
            if joined is None or (not joined.cached and joined.state in _NEEDS_PROFILE):
                imported += _refusable(call, profile, ProfileImportOk) is not None
        for policy in list(self.policies.values()):
            _refusable(call, policy, SetPolicyOk)
        cached = sum(reply.cached for reply in registered.values())
        return (
            f"{len(self.claimed)} GPU(s) claimed, {len(self.plans)} plan(s), "
            f"{len(self.registrations)} registration(s) ({cached} job(s) from the daemon's cache), "
            f"{imported} profile(s) imported, {len(self.policies)} policy(ies)"
        )


def _refusable(call: Call, request: Message, expected: type[M]) -> M | None:
    try:
        return call(request, expected)
    except PerseusClientError as exc:
        if exc.lost_link:
            raise
        logger.warning("perseus: the daemon refused %s again after reconnecting: %s", request.TYPE, exc)
        return None

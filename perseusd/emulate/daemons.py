"""The coordinator's side of several daemons: one client each, the job's combined state, counters of all.

A job whose pipelines run on several nodes is one job to the emulator but one job per daemon to the daemons
(each knows the pipelines it runs; with a cluster plane they share what they learn through etcd). So the
coordinator samples every daemon's energy counters, gives every daemon the imported profile and the policy,
and combines the daemons' views of the job (`combined_state`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.protocol import JobInfo

from perseusd.emulate.preflight import EmulateError, counter_key

FAILED = "failed"
RUNNING = "running"
PROGRESS = ("registered", "profiling", "solving", RUNNING)
"""Job states in the order a job goes through them; any other state (e.g. "ended") ranks below them."""


class DaemonUnreachableError(EmulateError):
    """A daemon did not answer (it died or restarts: a node's daemon going away is what the job survives)."""


def combined_state(jobs: Sequence[JobInfo | None]) -> tuple[str | None, str]:
    """The job's state over all daemons and the failure reason: "failed" if any daemon failed it, "running"
    only when running on every daemon, else the least advanced (None while a daemon does not know it yet)."""
    for job in jobs:
        if job is not None and job.state == FAILED:
            return FAILED, job.error
    if any(job is None for job in jobs):
        return None, ""
    known = [job for job in jobs if job is not None]
    least = min(known, key=lambda job: PROGRESS.index(job.state) if job.state in PROGRESS else -1)
    return least.state, ""


class Daemons:
    """One client per daemon (index = the daemon's position on the command line), all for one job."""

    def __init__(self, clients: Sequence[PerseusClient], job: str) -> None:
        self._clients = tuple(clients)
        self._job = job
        self._policy_set: set[int] = set()

    def __len__(self) -> int:
        return len(self._clients)

    def read_counters(self) -> dict[str, float | None]:
        """Every GPU's energy counter by its counter key (`preflight.counter_key`)."""
        counters: dict[str, float | None] = {}
        for daemon, client in enumerate(self._clients):
            try:
                gpus = client.status().gpus
            except PerseusClientError as exc:
                raise DaemonUnreachableError(f"the daemon at {client.runtime_dir}: {exc}") from None
            for gpu in gpus:
                counters[counter_key(daemon, gpu.uuid, len(self._clients))] = gpu.energy_j
        return counters

    def import_profile(self, csv: str, source: str, p_block_w: float) -> None:
        """Give every daemon the job's profile (before the stages register)."""
        for client in self._clients:
            try:
                client.profile_import(csv, source=source, p_block_w=p_block_w, job=self._job)
            except PerseusClientError as exc:
                raise EmulateError(f"importing the profile at {client.runtime_dir} failed: {exc}") from None

    def jobs(self, policy: str | None = None, target: float = 0.0) -> list[JobInfo | None]:
        """Each daemon's view of the job (None where it does not know it yet); sets `policy` once on each
        daemon that knows the job."""
        infos: list[JobInfo | None] = []
        for daemon, client in enumerate(self._clients):
            try:
                job = next((info for info in client.jobs().jobs if info.job == self._job), None)
                if job is not None and policy and daemon not in self._policy_set:
                    client.set_policy(policy, target, job=self._job)
                    self._policy_set.add(daemon)
            except PerseusClientError as exc:
                raise DaemonUnreachableError(
                    f"asking the daemon at {client.runtime_dir} about the job failed: {exc}"
                ) from None
            infos.append(job)
        return infos


def summary_job(jobs: Sequence[JobInfo | None]) -> JobInfo | None:
    """The first daemon's view of the job with the combined state, and the switching statistics (clock changes
    per iteration, computations begun at a wrong clock) averaged over the daemons that report them: each
    daemon counts only its own GPUs, and the stages of a pipeline differ."""
    first = next((job for job in jobs if job is not None), None)
    if first is None:
        return None
    state, error = combined_state(jobs)
    changes = [j.clock_changes_per_iteration for j in jobs if j and j.clock_changes_per_iteration is not None]
    wrong = [j.wrong_clock_fraction for j in jobs if j and j.wrong_clock_fraction is not None]
    return dataclasses.replace(
        first,
        state=state or first.state,
        error=error or first.error,
        clock_changes_per_iteration=round(statistics.fmean(changes), 3) if changes else None,
        wrong_clock_fraction=round(statistics.fmean(wrong), 5) if wrong else None,
    )

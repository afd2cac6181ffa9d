"""The Slurm requests: `slurm_jobs` (any caller: its own jobs; an admin: all) and the prolog's and epilog's
admin requests (`perseusd.leasing.slurm_jobs` keeps the records)."""

from __future__ import annotations

from collections.abc import Callable

from perseus_client.protocol import (
    AdminSlurmEpilog,
    AdminSlurmProlog,
    SlurmJobOk,
    SlurmJobsReply,
    SlurmJobsRequest,
)

from perseusd.leasing.identity import Caller
from perseusd.leasing.slurm_jobs import SlurmLedger


class SlurmRequests:
    def __init__(
        self,
        ledger: SlurmLedger,
        is_admin: Callable[[Caller], bool],
        release: Callable[[list[str]], tuple[str, ...]],
    ) -> None:
        self._ledger = ledger
        self._is_admin = is_admin
        self._release = release
        """Drop the leases on these GPUs and restore them; returns those restored."""

    def jobs(self, caller: Caller, _message: SlurmJobsRequest) -> SlurmJobsReply:
        uid = None if self._is_admin(caller) else caller.uid
        return SlurmJobsReply(jobs=self._ledger.records(uid))

    def prolog(self, _caller: Caller, message: AdminSlurmProlog) -> SlurmJobOk:
        return SlurmJobOk(record=self._ledger.prolog(message.job, message.uid, message.gpu_minors))

    def epilog(self, _caller: Caller, message: AdminSlurmEpilog) -> SlurmJobOk:
        return SlurmJobOk(record=self._ledger.epilog(message.job, self._release))

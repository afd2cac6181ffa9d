"""The monitor-only daemon (`monitor_only = true`, zeusd's `gpu-read`): it reads energy and status for every
user and never writes a clock or a limit. The requests that would lead to a write are refused here, before
any handler runs; the GPUs themselves are read-only devices (`perseusd.gpu.readonly`) besides.

What still works: hello (the GPUs), status, `energy_read` (energy windows, `perseusctl measure`), `jobs`
(empty), the metrics. Refused: claims and everything that needs a lease (clocks, plans, job registration and
policies, profiles, straggler announcements) and every admin write (reset, power limits, caps, pool budgets).
"""

from __future__ import annotations

from perseus_client.protocol import (
    AdminClearCap,
    AdminPoolSetBudget,
    AdminReset,
    AdminSetCap,
    AdminSetJobPriority,
    AdminSetPowerLimit,
    AnnounceStraggler,
    Claim,
    ErrorCode,
    Message,
    ProfileImport,
    ProtocolError,
    Register,
    SetClock,
    SetPlan,
    SetPolicy,
)

WRITING_REQUESTS: frozenset[type[Message]] = frozenset(
    {
        Claim,
        SetClock,
        SetPlan,
        Register,
        SetPolicy,
        ProfileImport,
        AnnounceStraggler,
        AdminReset,
        AdminSetPowerLimit,
        AdminSetCap,
        AdminClearCap,
        AdminSetJobPriority,
        AdminPoolSetBudget,
    }
)
"""Requests that write a GPU, or lead to writes (a claim, a job's plan), or change what is written."""


def refuse_writes(message: Message) -> None:
    """Raise PERMISSION_DENIED for a request a monitor-only daemon does not serve."""
    if type(message) in WRITING_REQUESTS:
        raise ProtocolError(
            ErrorCode.PERMISSION_DENIED,
            f"{message.TYPE}: perseusd runs monitor-only (monitor_only = true): it reads energy and status "
            "and never writes a clock or a limit; ask the node's operator for a controlling perseusd",
        )

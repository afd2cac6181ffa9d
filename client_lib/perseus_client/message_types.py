"""Every message type of the wire protocol, by where it may come: requests of the control socket, of the admin
socket, replies, events and the other frames of the event socket, and what the daemon pushes there unasked;
`MESSAGE_TYPES`, the registry the decoders look a frame's type up in (stdlib only). A new message is
registered here (docs/protocol.md, "Changing the protocol"); `perseus_client.protocol` re-exports these.
"""

from __future__ import annotations

from perseus_client import (
    cap_messages,
    carry_messages,
    clock_messages,
    energy_messages,
    event_messages,
    job_messages,
    lease_messages,
    message,
    pool_messages,
    slurm_messages,
    status_messages,
)

EVENT_TYPES: tuple[type[message.Message], ...] = (
    event_messages.ComputationBegin,
    event_messages.ComputationEnd,
    event_messages.StepBegin,
    event_messages.StepEnd,
)
STREAM_TYPES: tuple[type[message.Message], ...] = (event_messages.EventsEnd, carry_messages.CarryReady)
"""Frames of the event socket that are not events (read in stream order, never counted as events)."""
PUSH_TYPES: tuple[type[message.Message], ...] = (carry_messages.Carry,)
"""Frames the daemon sends a client on its event connection unasked."""
REQUEST_TYPES: tuple[type[message.Message], ...] = (
    lease_messages.Hello,
    lease_messages.Claim,
    lease_messages.Release,
    clock_messages.SetClock,
    clock_messages.SetPlan,
    clock_messages.ClearPlan,
    status_messages.StatusRequest,
    job_messages.Register,
    job_messages.SetPolicy,
    job_messages.JobsRequest,
    job_messages.FrontierRequest,
    job_messages.PlanRequest,
    job_messages.ProfileExport,
    job_messages.ProfileImport,
    job_messages.AnnounceStraggler,
    event_messages.EventCount,
    energy_messages.EnergyRead,
    slurm_messages.SlurmJobsRequest,
    *EVENT_TYPES,
)
ADMIN_TYPES: tuple[type[message.Message], ...] = (
    lease_messages.AdminReset,
    clock_messages.AdminSetPowerLimit,
    status_messages.StatusRequest,
    pool_messages.AdminPoolSetBudget,
    pool_messages.AdminPoolStatus,
    pool_messages.AdminPoolRelease,
    cap_messages.AdminSetCap,
    cap_messages.AdminClearCap,
    cap_messages.AdminCapStatus,
    cap_messages.AdminSetJobPriority,
    slurm_messages.AdminSlurmProlog,
    slurm_messages.AdminSlurmEpilog,
    slurm_messages.SlurmJobsRequest,
)
REPLY_TYPES: tuple[type[message.Message], ...] = (
    lease_messages.HelloOk,
    lease_messages.ClaimOk,
    lease_messages.ReleaseOk,
    clock_messages.SetClockOk,
    clock_messages.SetPlanOk,
    clock_messages.ClearPlanOk,
    status_messages.StatusReply,
    lease_messages.AdminResetOk,
    clock_messages.PowerLimitOk,
    event_messages.EventAck,
    job_messages.RegisterOk,
    job_messages.SetPolicyOk,
    job_messages.JobsReply,
    job_messages.DocumentReply,
    job_messages.ProfileReply,
    job_messages.ProfileImportOk,
    job_messages.AnnounceStragglerOk,
    event_messages.EventCountOk,
    energy_messages.EnergyReading,
    pool_messages.PoolBudgetOk,
    pool_messages.PoolReleaseOk,
    pool_messages.PoolStatusReply,
    cap_messages.CapStatusReply,
    cap_messages.JobPriorityOk,
    slurm_messages.SlurmJobsReply,
    slurm_messages.SlurmJobOk,
    message.ErrorReply,
)
MESSAGE_TYPES: dict[str, type[message.Message]] = {
    cls.TYPE: cls for cls in (*REQUEST_TYPES, *ADMIN_TYPES, *REPLY_TYPES, *STREAM_TYPES, *PUSH_TYPES)
}

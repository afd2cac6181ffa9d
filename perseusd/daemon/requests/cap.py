"""The power-cap admin requests: set or clear the node budget, the cap's status, a job's priority tier.

Reached only through the admin socket (the core checks the caller is an admin first); every change is logged
with who made it (the kernel-attested uid and pid of the caller).
"""

from __future__ import annotations

import logging
import math

from perseus_client import cap_messages as cap_msg
from perseus_client.protocol import ErrorCode, ProtocolError

from perseusd.cap.node_cap import NodeCap
from perseusd.leasing.identity import Caller
from perseusd.power.allocate import PRIORITIES

logger = logging.getLogger(__name__)

MAX_BUDGET_W = 1e7
MAX_JOB_NAME = 256


def who(caller: Caller) -> str:
    return f"uid {caller.uid} pid {caller.pid}"


class CapRequests:
    def __init__(self, cap: NodeCap) -> None:
        self._cap = cap

    def set_budget(self, caller: Caller, message: cap_msg.AdminSetCap) -> cap_msg.CapStatusReply:
        budget_w = message.budget_w
        if not (math.isfinite(budget_w) and 0 < budget_w <= MAX_BUDGET_W):
            raise ProtocolError(ErrorCode.BAD_FIELD, f"the node budget must be 0..{MAX_BUDGET_W:g} W")
        floor_w = self._cap.power_floor_w()
        if budget_w < floor_w:  # it could not be met: refused, rather than applied and reported as failed
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"the node budget {budget_w:g} W is below the node's floor of {floor_w:g} W (every GPU at "
                "its lowest power limit): nothing changed",
            )
        logger.warning("power cap: node budget set to %.1f W by %s", budget_w, who(caller))
        self._cap.set_budget_w(budget_w, who(caller))
        return cap_status(self._cap)

    def clear_budget(self, caller: Caller, _message: cap_msg.AdminClearCap) -> cap_msg.CapStatusReply:
        logger.warning("power cap: node budget cleared by %s", who(caller))
        self._cap.set_budget_w(None, who(caller))
        return cap_status(self._cap)

    def status(self, _caller: Caller, _message: cap_msg.AdminCapStatus) -> cap_msg.CapStatusReply:
        return cap_status(self._cap)

    def set_priority(self, caller: Caller, message: cap_msg.AdminSetJobPriority) -> cap_msg.JobPriorityOk:
        if not 0 < len(message.job) <= MAX_JOB_NAME:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"admin_set_job_priority.job: 1..{MAX_JOB_NAME} characters"
            )
        if message.priority not in PRIORITIES:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "admin_set_job_priority.priority: 0 (low), 1 (normal) or 2 (high)"
            )
        job = self._cap.job(message.job)
        if job is None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"no job {message.job} on this node (perseusctl jobs lists them): a tier is given to a job "
                "that has registered, bound to its owner",
            )
        self._cap.set_priority(job.name, job.uid, message.priority)
        logger.warning(
            "power cap: job %s priority set to %d by %s", message.job, message.priority, who(caller)
        )
        return cap_msg.JobPriorityOk(job=message.job, priority=message.priority)


def cap_status(cap: NodeCap) -> cap_msg.CapStatusReply:
    """The cap as `perseusctl cap status` shows it."""
    if cap.grant_w is None:
        cap.refresh_demand()  # uncapped, the main loop does not keep the jobs' loads up to date
    allocation = cap.allocation
    measured = cap.measured()
    managed = {}
    if allocation is not None:
        for load in cap.last_loads:
            managed.update(dict.fromkeys(load.gpus, load.name))
    gpus = tuple(
        cap_msg.CapGpu(
            uuid=r.uuid,
            limit_w=cap.writer.limits_w.get(r.uuid),
            min_w=r.min_w,
            max_w=r.max_w,
            managed_by=managed.get(r.uuid, ""),
        )
        for r in cap.ranges
    )
    jobs = tuple(
        cap_msg.CapJob(
            job=g.name,
            priority=g.priority,
            point=g.index,
            time_s=g.time_s,
            uncapped_point=g.base_index,
            uncapped_time_s=g.base_time_s,
            slowdown=round(max(0.0, g.slowdown), 6),
            power_w=round(g.power_w, 3),
        )
        for g in (allocation.jobs if allocation is not None else ())
    )
    problem = allocation.reason if allocation is not None else ""
    if cap.writer.write_error:
        problem = f"{problem}; " if problem else ""
        problem += f"power limits not written: {cap.writer.write_error}"
    if cap.save_error:
        problem = f"{problem}; " if problem else ""
        problem += f"not kept across a restart: {cap.save_error}"
    return cap_msg.CapStatusReply(
        active=cap.grant_w is not None,
        budget_w=cap.budget_w,
        pool_grant_w=cap.pool_grant_w,
        grant_w=cap.grant_w,
        enforcement="strict" if cap.check.forced_strict else cap.settings.enforcement,
        window_s=cap.settings.window_s,
        measured_w=None if measured is None else round(measured.power_w, 3),
        measured_span_s=0.0 if measured is None else round(measured.span_s, 3),
        floor_w=cap.power_floor_w(),
        demand_w=round(cap.demand_w, 3),
        planned_w=None if allocation is None else round(allocation.planned_w, 3),
        plan_target_w=None if cap.plan_target_w is None else round(cap.plan_target_w, 3),
        feasible=allocation.feasible if allocation is not None else True,
        strict=allocation.strict if allocation is not None else False,
        problem=problem,
        over_windows=cap.check.over_windows,
        set_by=cap.set_by,
        gpus=gpus,
        jobs=jobs,
    )

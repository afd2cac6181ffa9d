"""The re-plans of a spanning job by the node that leads it: each pipeline's step time merged over its nodes
feeds the pipeline's straggler detector; when a straggler starts or ends, an announcement changes or a node
set another policy, the leader shares a new plan epoch, each changed pipeline switching `SWITCH_LEAD_STEPS`
steps on, on every node. It decides only on a fresh view (`perseusd.jobs.spanning` calls it); the other
nodes follow the plan it shares.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping
from dataclasses import replace

from perseusd.cluster.span_board import MemberRecord, PipelinePlan, StragglerPlan
from perseusd.errors import InvalidValueError
from perseusd.jobs.cluster_link import ClusterLink, significant
from perseusd.jobs.job import Job
from perseusd.jobs.span_members import members_of, merged_spans
from perseusd.jobs.span_state import GlobalRun, SpanState
from perseusd.jobs.straggling import (
    ActiveStraggler,
    Detector,
    StragglerSettings,
    pick_straggler,
    point_for,
    relative_slowness,
)
from perseusd.planner.policy import Policy

logger = logging.getLogger(__name__)

SWITCH_LEAD_STEPS = 2
"""A re-plan switches a pipeline this many steps after the latest step the leader saw: time for every node
to read the plan (a node that reads it later switches at its next step boundary)."""


class SpanReplanner:
    """The straggler re-plans of every spanning job this node leads (see module)."""

    def __init__(self, link: ClusterLink, stragglers: StragglerSettings) -> None:
        self._link = link
        self._stragglers = stragglers

    def detect(self, job: Job, state: SpanState) -> None:
        """Feed each pipeline's merged step time to its detector; re-plan when a straggler starts or ends,
        when an announcement changed, or when a node set another policy. Waits while the view is not fresh."""
        if state.view_state != "fresh" or state.plan is None or state.view is state.detected_view:
            return
        state.detected_view = state.view  # each view is looked at once
        members = members_of(job, state, None)
        changed = follow_policy(job, members)
        for pipeline, (step, compute_s) in merged_spans(members).items():
            run = state.runs.setdefault(pipeline, GlobalRun(pipeline, Detector(self._stragglers)))
            if step <= run.last_step:
                continue
            run.last_step = step
            run.compute_times_s.append(compute_s)
            changed = self._observe(job, state, run, step) or changed
        announced = dict(state.announced.items())
        if announced != state.planned_announcements:
            state.planned_announcements = announced
            changed = True
        if changed:
            self._decide(job, state, members)

    def _slowness(self, job: Job, state: SpanState, run: GlobalRun) -> float | None:
        assert state.plan is not None
        entry = state.plan.point_for(run.pipeline)
        point = job.point(entry.point if entry is not None else state.plan.base)
        if point is None or not run.compute_times_s or point.time_s <= 0:
            return None
        return statistics.median(run.compute_times_s) / point.time_s

    def _observe(self, job: Job, state: SpanState, run: GlobalRun, step: int) -> bool:
        own = self._slowness(job, state, run)
        others = [
            s for p, r in state.runs.items() if p != run.pipeline and (s := self._slowness(job, state, r))
        ]
        relative = None if own is None else relative_slowness(own, others)
        if relative is None or step < state.detect_from_step:
            return False
        calm = state.plan is None or state.plan.straggler is None
        if not run.detector.observe(relative, calm=calm):
            return False
        if run.detector.straggling:
            state.detected[run.pipeline] = ActiveStraggler(
                run.pipeline, run.detector.factor, "detected", step
            )
            logger.info("job %s: pipeline %d straggles (x%.3f)", job.name, run.pipeline, run.detector.factor)
        else:
            state.detected.pop(run.pipeline, None)
            logger.info("job %s: pipeline %d recovered", job.name, run.pipeline)
        return True

    def _decide(self, job: Job, state: SpanState, members: Mapping[str, MemberRecord]) -> None:
        plan, chosen = state.plan, job.choose_point()
        if plan is None or chosen is None:
            return
        since = max((s.step for m in members.values() for s in m.spans), default=0)
        candidates = [ActiveStraggler(p, f, "announced", since) for p, f in state.announced.items()]
        straggler = pick_straggler([*candidates, *state.detected.values()])
        entries = []
        for pipeline in sorted({p for m in members.values() for p, _ in m.slots}):
            point = point_for(
                pipeline,
                straggler,
                job.points,
                chosen.point,
                chosen.fastest,
                job.shape.num_stages,
                job.p_block_w,
            )
            current = plan.point_for(pipeline) or PipelinePlan(pipeline, plan.base, 0)
            keep = current.point == point.index
            entries.append(
                current if keep else PipelinePlan(pipeline, point.index, since + SWITCH_LEAD_STEPS)
            )
        planned = (
            None
            if straggler is None
            else StragglerPlan(
                straggler.pipeline, significant(straggler.factor, 4), straggler.source, straggler.since_step
            )
        )
        new = replace(
            plan,
            node=self._link.node_name,
            base=chosen.point.index,
            pipelines=tuple(entries),
            straggler=planned,
        )
        if (new.base, new.pipelines, new.straggler) == (plan.base, plan.pipelines, plan.straggler):
            return
        state.plan = replace(new, epoch=plan.epoch + 1)
        self._link.plane.publish_plan(job.cluster_key, state.plan)
        logger.info(
            "job %s: re-planned (epoch %d) around %s", job.name, state.plan.epoch, straggler or "no straggler"
        )
        state.detect_from_step = since + 1 + self._stragglers.hold_iterations
        for run in state.runs.values():
            run.detector.restart()


def follow_policy(job: Job, members: Mapping[str, MemberRecord]) -> bool:
    """The newest policy set on any node of the job is the job's."""
    newest = max(members.values(), key=lambda m: m.policy_since)
    if newest.policy_since <= 0 or not newest.policy:
        return False
    try:
        policy = Policy(newest.policy, newest.target)
    except InvalidValueError:  # a policy this version does not know (a newer node's)
        return False
    if policy == job.policy:
        return False
    job.policy = policy
    return True

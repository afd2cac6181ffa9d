"""Jobs whose pipelines span nodes: one job over several daemons, coordinated through etcd.

A job whose pipelines are not complete on this node publishes this node's record (`MemberRecord`: its
identity, the stages it runs, its progress) under the job's identity key; once the records of all nodes cover
every stage of a pipeline the job *spans* (`job.span` is set) and:

- every node profiles the stages it runs and shares the profile it measured (a blob);
- one node, the *leader* (elected through etcd: the first to create the job's leader key, attached to its
  lease), merges the shares, solves the frontier once and shares the solution (frontier and merged profile)
  and its plan (`PlanRecord`: the policy's point, and each pipeline's point around a straggler);
- every node runs its stages' part of the plan, measures its GPUs' energy and reports each pipeline's part of
  a step (its stages' step begin to their last computation's end), from which the leader detects stragglers
  and re-plans (a new plan epoch, each changed pipeline switching at a step boundary on every node).

When the leader goes, its keys vanish with its lease and another node takes the role (it has the solution and
shares it again: no new solve). When a node goes, the others keep running their part. When etcd is lost,
every node keeps running the last plan; re-plans wait for etcd. Nothing here waits on etcd: the plane's thread
does the talking, this module reads its last view.

This module is every node's part: joining, sharing its record and its profile, loading and applying the plan,
and handing the leader's role to `perseusd.jobs.span_leader` (the solve) and `perseusd.jobs.span_replan`
(the re-plans); `perseusd.jobs.span_members` reads the nodes' records together.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from perseusd.cluster.span_board import MemberRecord, PipelinePlan, PipelineSpan, ProfileShare
from perseusd.jobs.cluster_link import ClusterLink, significant
from perseusd.jobs.job import Deployed, Job
from perseusd.jobs.span_host import SpanHost
from perseusd.jobs.span_leader import SpanLeader
from perseusd.jobs.span_members import covered_pipelines, local_slots, members_of, missing_text
from perseusd.jobs.span_merge import ShareError, decode_solution, encode_share
from perseusd.jobs.span_replan import SpanReplanner
from perseusd.jobs.span_state import SpanState
from perseusd.jobs.states import FAILED, REGISTERED, RUNNING, SOLVING
from perseusd.jobs.straggling import ActiveStraggler, StragglerSettings
from perseusd.jobs.waiting import WAITING, set_waiting
from perseusd.planner.profile import Profile

logger = logging.getLogger(__name__)

SYNC_INTERVAL_S = 0.1
"""How often a spanning job reads its view and shares its record (the plane talks to etcd every round)."""


class SpanCoordinator:
    """Every spanning job of this node (see module)."""

    def __init__(self, link: ClusterLink, stragglers: StragglerSettings, host: SpanHost) -> None:
        self._link = link
        self._plane = link.plane
        self._host = host
        self.node = link.node_name
        self._candidates: dict[str, SpanState] = {}
        self.leader = SpanLeader(link, host)
        """This node's part as the leader of a job: the solve (its results come through the job manager)."""
        self._replanner = SpanReplanner(link, stragglers)

    # ------------------------------------------------------------------ joining

    def join(self, job: Job) -> bool:
        """A registered job without a complete pipeline here: share this node's record; True once the
        records of the job's nodes cover a whole pipeline (the job spans them from now on)."""
        state = self._candidates.setdefault(job.cluster_key, SpanState(self.node))
        self._sync(job, state, force=state.own is None or state.own.slots != local_slots(job))
        covered = covered_pipelines(job, self._members(job, state))
        if not covered:
            set_waiting(job, self._waiting(job, state))
            return False
        del self._candidates[job.cluster_key]
        job.span = state
        set_waiting(job, "")
        self._plane.campaign(job.cluster_key)
        logger.info(
            "job %s spans nodes %s (pipelines %s complete)",
            job.name,
            ", ".join(sorted(self._members(job, state))),
            covered,
        )
        return True

    def ended(self, job: Job) -> None:
        """The job's last GPU here left (its keys are withdrawn with the job's)."""
        self._candidates.pop(job.cluster_key, None)

    def withdraw(self, job: Job) -> None:
        """A candidate whose pipelines turned out complete here: it runs on this node alone."""
        if self._candidates.pop(job.cluster_key, None) is not None:
            self._link.forget(job.cluster_key)

    def _waiting(self, job: Job, state: SpanState) -> str:
        members = self._members(job, state)
        return f"{WAITING}the other stages of its pipelines on other nodes ({missing_text(job, members)})"

    # ------------------------------------------------------------------ every tick

    def sync(self, job: Job) -> bool:
        """Read the last view and share this node's record, at most every `SYNC_INTERVAL_S` (the main loop
        ticks after every event: the hot path); True when it did."""
        state = job.span
        assert state is not None
        return self._sync(job, state)

    def _sync(self, job: Job, state: SpanState, *, force: bool = False) -> bool:
        now_s = time.monotonic()
        if not force and now_s - state.synced_at_s < SYNC_INTERVAL_S:
            return False
        state.synced_at_s = now_s
        self._refresh(job, state)
        self._publish_member(job, state)
        return True

    def step(self, job: Job) -> None:
        """Move the job on by the plan: lead when this node leads, load the solution, follow re-plans."""
        state = job.span
        assert state is not None
        if state.leading:
            self._lead(job, state)
        if job.state == FAILED:
            return
        if state.plan is not None and state.plan.error:
            self._host.fail(job, state.plan.error)
            return
        plan = state.plan
        if plan is None or plan.solution is None:
            return
        if job.state in (REGISTERED, SOLVING) or (job.state == RUNNING and plan.solution != state.solution):
            if self._load(job, state):
                self._host.run_plan(job)
        elif job.state == RUNNING:
            self.apply(job)

    def _refresh(self, job: Job, state: SpanState) -> None:
        view = self._plane.snapshot(job.cluster_key)
        state.view_state = view.state.value
        state.announced = {p: a.factor for p, a in view.stragglers.items()}
        span = view.span
        if span is None or not view.usable:
            state.leading = state.leading and view.fresh
            return
        state.view = span
        plan = span.plan
        if plan is not None and (state.plan is None or plan.epoch >= state.plan.epoch):
            state.plan = plan
        state.leading = span.leader == self.node and view.fresh

    def _members(self, job: Job, state: SpanState) -> dict[str, MemberRecord]:
        """The job's records, with this node's last shared record in place of the one etcd holds."""
        return members_of(job, state, None)

    def _record(self, job: Job, state: SpanState) -> MemberRecord:
        measured = self._host.measured(job)
        spans = tuple(
            PipelineSpan(run.pipeline, run.last_done_step, significant(compute_s))
            for run in job.runs.values()
            if run.last_done_step >= 0 and (compute_s := run.compute_time_s()) is not None
        )
        profiling = [s.steps_done for s in job.profiling_slots()]
        return MemberRecord(
            node=self.node,
            identity=job.identity,
            slots=local_slots(job),
            state=str(job.state),
            profiling_iterations=max(profiling) if profiling else job.profiling_iterations,
            profiling_energy_j=significant(job.profiling_energy_j),
            profile=state.share,
            measured_j=_significant(measured.running_j if measured else None),
            measured_all_max_j=_significant(measured.all_max_j if measured else None),
            spans=spans,
            error=state.error if job.state == FAILED or state.error else "",
            policy=job.policy.name,
            target=job.policy.target,
            policy_since=state.policy_since,
            clock_latency_s=_significant(self._host.clock_latency_s(job)),
        )

    def _publish_member(self, job: Job, state: SpanState) -> None:
        state.own = self._record(job, state)
        try:
            self._plane.publish_member(job.cluster_key, state.own)
        except ValueError as exc:  # never fatal
            logger.debug("job %s: record not shared: %s", job.name, exc)

    # ------------------------------------------------------------------ this node's profile

    def share(self, job: Job, profile: Profile, p_block_w: float, overhead_s: float | None) -> None:
        """This node's stages are profiled: share what it measured (the leader merges every node's)."""
        state = job.span
        assert state is not None
        learned = {s.stage: s.learner.learned for s in job.slots.values() if s.learner.learned is not None}
        orders = {stage: order for stage, order in learned.items() if order is not None}
        share = encode_share(profile, orders, job.waiting_w)
        ref = self._plane.publish_blob(job.cluster_key, f"profile-{self.node}", share)
        state.share = ProfileShare(ref, p_block_w, overhead_s)
        self._publish_member(job, state)
        logger.info("job %s: this node's stages are profiled; their profile is shared", job.name)

    def failed(self, job: Job, message: str) -> None:
        """This node's part cannot be planned: the leader fails the whole job with `message`."""
        if job.span is not None:
            job.span.error = message
            self._publish_member(job, job.span)

    def policy_set(self, job: Job, when_s: float) -> None:
        if job.span is not None:
            job.span.policy_since = when_s
            self._publish_member(job, job.span)

    # ------------------------------------------------------------------ the solution

    def _load(self, job: Job, state: SpanState) -> bool:
        """The plan's solution installed on this job (fetched first): True once it is."""
        plan = state.plan
        assert plan is not None
        assert plan.solution is not None
        ref = plan.solution
        if state.solution == ref:
            return True
        data = self._plane.blob(job.cluster_key, ref)
        if data is None:
            return False
        try:
            frontier, profile, p_block_w = decode_solution(data, f"the solution of job {job.name}")
        except ShareError as exc:
            logger.warning("job %s: %s", job.name, exc)
            return False
        self._host.adopt_solution(job, frontier, profile, p_block_w)
        state.solution, state.solution_data = ref, data
        logger.info(
            "job %s: runs the solution %s (%d points)", job.name, ref.digest[:12], len(frontier.points)
        )
        return True

    def deployed(self, job: Job) -> Deployed | None:
        """The plan's policy point (the leader's choice), with the frontier's fastest and slowest."""
        state, chosen = job.span, job.choose_point()
        if state is None or state.plan is None or chosen is None:
            return chosen
        base = job.point(state.plan.base)
        return chosen if base is None else replace(chosen, point=base)

    def apply(self, job: Job) -> None:
        """Each local pipeline to the point the plan gives it (at the plan's step)."""
        state = job.span
        if state is None or state.plan is None or job.deployed is None:
            return
        plan = state.plan
        base = job.point(plan.base)
        if base is not None and base != job.deployed.point:
            job.deployed = replace(job.deployed, point=base)
        for pipeline, run in job.runs.items():
            entry = plan.point_for(pipeline) or PipelinePlan(pipeline, plan.base, 0)
            if entry.point in job.points_by_index and run.target_index() != entry.point:
                self._host.switch_pipeline(job, pipeline, entry.point, entry.from_step)
        if plan.straggler is not None:
            s = plan.straggler
            job.straggler = ActiveStraggler(s.pipeline, s.factor, s.source, s.since_step)
        else:
            job.straggler = None
        state.applied_epoch = plan.epoch

    # ------------------------------------------------------------------ the leader

    def _lead(self, job: Job, state: SpanState) -> None:
        plan = state.plan
        if plan is None or plan.solution is None:
            self.leader.solve_when_ready(job, state)
            return
        if job.state == FAILED:
            return
        if state.solution != plan.solution and not self._load(job, state):
            return
        view_plan = state.view.plan if state.view is not None else None
        assert state.plan is not None
        if state.plan.node != self.node or (view_plan is not None and view_plan.node != self.node):
            self.leader.take_over(job, state)
        if job.state == RUNNING:
            self._replanner.detect(job, state)


def _significant(value: float | None) -> float | None:
    return None if value is None else significant(value)

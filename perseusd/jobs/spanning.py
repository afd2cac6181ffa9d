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
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from perseusd.cluster.span_board import (
    MemberRecord,
    PipelinePlan,
    PipelineSpan,
    PlanRecord,
    ProfileShare,
    StragglerPlan,
)
from perseusd.errors import InvalidValueError
from perseusd.jobs.cluster_link import ClusterLink, significant
from perseusd.jobs.job import Deployed, Job
from perseusd.jobs.metering import MeasuredSaving
from perseusd.jobs.shape import StageOrder
from perseusd.jobs.span_merge import (
    ShareError,
    decode_share,
    decode_solution,
    encode_share,
    encode_solution,
    merge_shares,
)
from perseusd.jobs.span_state import GlobalRun, SpanState
from perseusd.jobs.states import FAILED, REGISTERED, RUNNING, SOLVING
from perseusd.jobs.straggling import (
    ActiveStraggler,
    Detector,
    StragglerSettings,
    pick_straggler,
    point_for,
    relative_slowness,
)
from perseusd.jobs.waiting import WAITING, set_waiting
from perseusd.planner.plan import Frontier
from perseusd.planner.policy import Policy
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import WaitingPoints
from perseusd.profiling.adequacy import plan_problems

logger = logging.getLogger(__name__)

SWITCH_LEAD_STEPS = 2
"""A re-plan switches a pipeline this many steps after the latest step the leader saw: time for every node
to read the plan (a node that reads it later switches at its next step boundary)."""
SOLUTION = "solution"
SYNC_INTERVAL_S = 0.1
"""How often a spanning job reads its view and shares its record (the plane talks to etcd every round)."""


class SpanHost(Protocol):
    """What the coordinator needs of the job manager."""

    def adopt_solution(self, job: Job, frontier: Frontier, profile: Profile, p_block_w: float) -> None: ...
    def run_plan(self, job: Job) -> None: ...
    def submit_solve(
        self,
        job: Job,
        profile: Profile,
        p_block_w: float,
        orders: tuple[StageOrder, ...],
        latency_s: float | None = None,
        waiting_w: WaitingPoints | None = None,
    ) -> float: ...
    def clock_latency_s(self, job: Job) -> float | None: ...
    def fail(self, job: Job, message: str) -> None: ...
    def measured(self, job: Job) -> MeasuredSaving | None: ...
    def switch_pipeline(self, job: Job, pipeline: int, index: int, from_step: int) -> None: ...


class SpanCoordinator:
    """Every spanning job of this node (see module)."""

    def __init__(self, link: ClusterLink, stragglers: StragglerSettings, host: SpanHost) -> None:
        self._link = link
        self._plane = link.plane
        self._stragglers = stragglers
        self._host = host
        self.node = link.node_name
        self._candidates: dict[str, SpanState] = {}

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
            self._solve_when_ready(job, state)
            return
        if job.state == FAILED:
            return
        if state.solution != plan.solution and not self._load(job, state):
            return
        view_plan = state.view.plan if state.view is not None else None
        assert state.plan is not None
        if state.plan.node != self.node or (view_plan is not None and view_plan.node != self.node):
            self._take_over(job, state)
        if job.state == RUNNING:
            self._detect(job, state)

    def _take_over(self, job: Job, state: SpanState) -> None:
        """This node leads now: share the solution and the plan again (no new solve)."""
        assert state.plan is not None
        assert state.solution_data is not None
        self._plane.publish_blob(job.cluster_key, SOLUTION, state.solution_data)
        state.plan = replace(state.plan, node=self.node)
        self._plane.publish_plan(job.cluster_key, state.plan)
        state.runs.clear()
        logger.info("job %s: this node leads it now (plan epoch %d)", job.name, state.plan.epoch)

    def _solve_when_ready(self, job: Job, state: SpanState) -> None:
        """Solve once every node shared its profile and the shares cover every stage."""
        if job.solve_future is not None or state.solving is not None:
            return
        members = self._members(job, state)
        failed = sorted(m.node for m in members.values() if m.error)
        if failed:
            self._publish_error(job, state, f"node {failed[0]}: {members[failed[0]].error}")
            return
        if any(m.profile is None for m in members.values()) or missing_text(job, members):
            return
        shares = []
        for member in members.values():
            assert member.profile is not None
            data = self._plane.blob(job.cluster_key, member.profile.blob)
            if data is None:
                return
            shares.append((member.profile, data))
        self._solve(job, state, members, shares)

    def _solve(
        self,
        job: Job,
        state: SpanState,
        members: Mapping[str, MemberRecord],
        shares: list[tuple[ProfileShare, bytes]],
    ) -> None:
        try:
            decoded = [decode_share(data) for _, data in shares]
        except ShareError as exc:
            self._publish_error(job, state, str(exc))
            return
        source = f"online profile of job {job.name} on {len(members)} nodes"
        profile, p_block_w, learned, waiting_w = merge_shares(
            decoded, [share.p_block_w for share, _ in shares], source
        )
        counted_j = sum(m.profiling_energy_j for m in members.values()) or None
        problems = plan_problems(profile, counted_j)
        if problems:
            self._publish_error(
                job, state, "no plan: the measurements cannot support one: " + "; ".join(problems)
            )
            return
        orders = job.shape.named_orders()
        if orders is None:
            if len(learned) < job.shape.num_stages:
                return  # "observed": every stage's order must be learned (retried)
            orders = tuple(learned[s] for s in range(job.shape.num_stages))
        state.merged = (profile, p_block_w)
        state.solving = shares[0][0].blob
        # The plan must suit the slowest clock switching of any node's GPUs (the switch-aware solve).
        latencies_s = [m.clock_latency_s for m in members.values() if m.clock_latency_s is not None]
        self._host.submit_solve(job, profile, p_block_w, orders, max(latencies_s, default=None), waiting_w)
        logger.info("job %s: solving the frontier for %d nodes", job.name, len(members))

    def solved(self, job: Job, frontier: Frontier) -> None:
        """The leader's solve finished: share the solution and the plan, then run it here."""
        state = job.span
        assert state is not None
        assert state.merged is not None
        profile, p_block_w = state.merged
        state.solving = None
        data = encode_solution(frontier, profile, p_block_w)
        ref = self._plane.publish_blob(job.cluster_key, SOLUTION, data)
        self._host.adopt_solution(job, frontier, profile, p_block_w)
        state.solution, state.solution_data = ref, data
        self._follow_policy(job, self._members(job, state))
        chosen = job.choose_point()
        if chosen is None:
            self._publish_error(job, state, "the frontier is empty")
            return
        previous = state.plan
        state.plan = PlanRecord(
            node=self.node,
            epoch=(previous.epoch if previous else 0) + 1,
            solves=(previous.solves if previous else 0) + 1,
            solution=ref,
            error="",
            base=chosen.point.index,
        )
        self._plane.publish_plan(job.cluster_key, state.plan)
        self._host.run_plan(job)

    def solve_failed(self, job: Job, message: str) -> None:
        state = job.span
        if state is not None:
            state.solving = None
            self._publish_error(job, state, message)

    def _publish_error(self, job: Job, state: SpanState, message: str) -> None:
        previous = state.plan
        if previous is not None and previous.error == message:
            return
        state.plan = PlanRecord(
            node=self.node,
            epoch=(previous.epoch if previous else 0) + 1,
            solves=previous.solves if previous else 0,
            solution=None,
            error=message,
            base=0,
        )
        self._plane.publish_plan(job.cluster_key, state.plan)

    # ------------------------------------------------------------------ stragglers (the leader)

    def _detect(self, job: Job, state: SpanState) -> None:
        """Feed each pipeline's merged step time to its detector; re-plan when a straggler starts or ends,
        when an announcement changed, or when a node set another policy. Waits while the view is not fresh."""
        if state.view_state != "fresh" or state.plan is None or state.view is state.detected_view:
            return
        state.detected_view = state.view  # each view is looked at once
        members = self._members(job, state)
        changed = self._follow_policy(job, members)
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

    def _follow_policy(self, job: Job, members: Mapping[str, MemberRecord]) -> bool:
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
            plan, node=self.node, base=chosen.point.index, pipelines=tuple(entries), straggler=planned
        )
        if (new.base, new.pipelines, new.straggler) == (plan.base, plan.pipelines, plan.straggler):
            return
        state.plan = replace(new, epoch=plan.epoch + 1)
        self._plane.publish_plan(job.cluster_key, state.plan)
        logger.info(
            "job %s: re-planned (epoch %d) around %s", job.name, state.plan.epoch, straggler or "no straggler"
        )
        state.detect_from_step = since + 1 + self._stragglers.hold_iterations
        for run in state.runs.values():
            run.detector.restart()


def members_of(job: Job, state: SpanState, own: MemberRecord | None) -> dict[str, MemberRecord]:
    """The job's records in the last view (other identities are never under its key; a forged one is left
    out), this node's as `own` (its last shared record when None)."""
    members = dict(state.view.members) if state.view is not None else {}
    members = {n: m for n, m in members.items() if m.identity == job.identity}
    own = own or state.own
    if own is not None:
        members[own.node] = own
    return members


def local_slots(job: Job) -> tuple[tuple[int, int], ...]:
    """(pipeline, stage) of every stage this node runs with all its GPUs."""
    groups: dict[tuple[int, int], int] = {}
    for slot in job.slots.values():
        groups[(slot.pipeline, slot.stage)] = groups.get((slot.pipeline, slot.stage), 0) + 1
    return tuple(sorted(k for k, n in groups.items() if n >= job.shape.stage_gpus))


def covered_pipelines(job: Job, members: Mapping[str, MemberRecord]) -> list[int]:
    """Pipelines every stage of which some node runs."""
    stages: dict[int, set[int]] = {}
    for member in members.values():
        for pipeline, stage in member.slots:
            stages.setdefault(pipeline, set()).add(stage)
    return sorted(p for p, found in stages.items() if len(found) == job.shape.num_stages)


def missing_text(job: Job, members: Mapping[str, MemberRecord]) -> str:
    """What no node of the job runs yet ("" when every stage of some pipeline is run), e.g. `pipeline 0:
    stages 4-7 on no node seen`, or a stage two nodes claim."""
    owners: dict[tuple[int, int], list[str]] = {}
    for member in members.values():
        for slot in member.slots:
            owners.setdefault(slot, []).append(member.node)
    doubles = [
        f"pipeline {p} stage {s} on {' and '.join(n)}" for (p, s), n in sorted(owners.items()) if len(n) > 1
    ]
    if doubles:
        return "two runs of the same job? " + "; ".join(doubles) + " (give each run its own run id)"
    parts = []
    for pipeline in sorted({p for p, _ in owners} or {0}):
        lacking = [s for s in range(job.shape.num_stages) if (pipeline, s) not in owners]
        if lacking:
            parts.append(f"pipeline {pipeline}: stages {ranges(lacking)} on no node seen")
    return "; ".join(parts)


def merged_spans(members: Mapping[str, MemberRecord]) -> dict[int, tuple[int, float]]:
    """Each pipeline's latest step every node of it reported, and its compute time: the longest node part."""
    by_pipeline: dict[int, list[PipelineSpan]] = {}
    hosts: dict[int, set[str]] = {}
    for member in members.values():
        for pipeline, _ in member.slots:
            hosts.setdefault(pipeline, set()).add(member.node)
        for span in member.spans:
            by_pipeline.setdefault(span.pipeline, []).append(span)
    merged = {}
    for pipeline, spans in by_pipeline.items():
        if len(spans) < len(hosts.get(pipeline, ())):
            continue  # a node of this pipeline has not reported yet
        merged[pipeline] = (min(s.step for s in spans), max(s.compute_s for s in spans))
    return merged


def ranges(values: list[int]) -> str:
    """`0-3,6`: sorted integers as ranges."""
    parts: list[str] = []
    start = prev = values[0]
    for value in [*values[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def _significant(value: float | None) -> float | None:
    return None if value is None else significant(value)

"""The node that leads a spanning job (elected through etcd: see `perseusd.jobs.spanning`): once every node
shared its profile it merges the shares, solves the frontier once and shares the solution and the plan; when
the previous leader went it takes the role over (sharing the solution and the plan again: no new solve); and
it shares why the job cannot be planned. Its re-plans around stragglers are `perseusd.jobs.span_replan`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from perseusd.cluster.span_board import MemberRecord, PlanRecord, ProfileShare
from perseusd.jobs.cluster_link import ClusterLink
from perseusd.jobs.job import Job
from perseusd.jobs.span_host import SpanHost
from perseusd.jobs.span_members import members_of, missing_text
from perseusd.jobs.span_merge import ShareError, decode_share, encode_solution, merge_shares
from perseusd.jobs.span_replan import follow_policy
from perseusd.jobs.span_state import SpanState
from perseusd.planner.plan import Frontier
from perseusd.profiling.adequacy import plan_problems

logger = logging.getLogger(__name__)

SOLUTION = "solution"
"""The name of the solution's blob under the job's key."""


class SpanLeader:
    """The leader's solve of every spanning job this node leads (see module)."""

    def __init__(self, link: ClusterLink, host: SpanHost) -> None:
        self._plane = link.plane
        self._host = host
        self.node = link.node_name

    def take_over(self, job: Job, state: SpanState) -> None:
        """This node leads now: share the solution and the plan again (no new solve)."""
        assert state.plan is not None
        assert state.solution_data is not None
        self._plane.publish_blob(job.cluster_key, SOLUTION, state.solution_data)
        state.plan = replace(state.plan, node=self.node)
        self._plane.publish_plan(job.cluster_key, state.plan)
        state.runs.clear()
        logger.info("job %s: this node leads it now (plan epoch %d)", job.name, state.plan.epoch)

    def solve_when_ready(self, job: Job, state: SpanState) -> None:
        """Solve once every node shared its profile and the shares cover every stage."""
        if job.solve_future is not None or state.solving is not None:
            return
        members = members_of(job, state, None)
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
        follow_policy(job, members_of(job, state, None))
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

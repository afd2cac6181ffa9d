"""The documents of a spanning job (a node's profile share, the leader's solution) and how the leader merges
the nodes' shares; and the coordinator's pure helpers: which pipelines the nodes cover, what is missing."""

from __future__ import annotations

import json

import pytest

from perseusd.cluster.span_board import JobIdentity, MemberRecord, PipelineSpan
from perseusd.jobs import span_merge
from perseusd.jobs.job import Job
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, auto_unit_time_s, solve
from perseusd.jobs.span_members import covered_pipelines, merged_spans, missing_text, ranges
from perseusd.planner.dag import Instruction
from perseusd.planner.policy import Policy
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.synthetic import synthetic_profile

SHAPE = JobShape("1f1b", 4, 4, 1)


def _stages(profile: Profile, stages: set[int]) -> Profile:
    return Profile.from_measurements([m for m in profile.measurements if m.stage in stages], profile.source)


def test_shares_of_some_stages_round_trip_and_merge_into_one_profile() -> None:
    profile = synthetic_profile(4, seed=2)
    halves = [_stages(profile, {0, 1}), _stages(profile, {2, 3})]
    order = ((Instruction.FORWARD, 0, 0), (Instruction.BACKWARD, 0, 0))
    decoded = [
        span_merge.decode_share(span_merge.encode_share(half, {2 * i: order}))
        for i, half in enumerate(halves)
    ]
    assert decoded[1][0].measurements == halves[1].measurements  # stages 2-3 only: no gap error
    assert decoded[0][1] == {0: order}
    merged, p_block_w, orders, waiting_w = span_merge.merge_shares(decoded, [80.0, 90.0, 100.0], "merged")
    assert sorted(merged.measurements, key=str) == sorted(profile.measurements, key=str)
    assert p_block_w == 90.0
    assert set(orders) == {0, 2}
    assert waiting_w == ()  # no node measured any: every wait at the blocking power
    # Two nodes measuring the same stage (data-parallel replicas): each row is their mean.
    first = Measurement(0, Instruction.FORWARD, 1410, 1.0, 10.0)
    second = Measurement(0, Instruction.FORWARD, 1410, 3.0, 30.0)
    replicas = [(Profile((first,)), {}, ()), (Profile((second,)), {}, ())]
    both, _, _, _ = span_merge.merge_shares(replicas, [1.0, 1.0], "m")
    assert both.measurements == (Measurement(0, Instruction.FORWARD, 1410, 2.0, 20.0),)


def test_each_nodes_waiting_power_by_clock_travels_and_merges_rising_with_the_clock() -> None:
    """The leader judges waits at the clock held in them, as one node does: every node's waiting power by
    clock reaches it in the share, per clock the median of the nodes that measured it, made to rise."""
    profile = synthetic_profile(4, seed=3)
    nodes = [
        ((900, 80.0), (1410, 100.0), (1980, 130.0)),
        ((900, 78.0), (1200, 95.0), (1980, 128.0)),
        ((900, 120.0), (1980, 131.0)),  # a noisy low clock: pooled, not a step
    ]
    shares = [
        span_merge.decode_share(span_merge.encode_share(_stages(profile, {i}), {}, waiting))
        for i, waiting in enumerate(nodes)
    ]
    assert [share[2] for share in shares] == nodes
    _, _, _, waiting_w = span_merge.merge_shares(shares, [130.0, 130.0, 130.0], "merged")
    clocks = [clock for clock, _ in waiting_w]
    watts = [w for _, w in waiting_w]
    assert clocks == [900, 1200, 1410, 1980]
    assert watts[0] == pytest.approx(80.0)  # the median of 80, 78 and 120
    assert watts[-1] == pytest.approx(130.0)
    assert watts == sorted(watts)
    older = span_merge.encode_share(_stages(profile, {0}), {}).replace(b', "waiting_w": []', b"")
    assert b"waiting_w" not in older
    assert span_merge.decode_share(older)[2] == ()  # an older node's share: no waiting powers
    for bad in ([[0, 80.0]], [[900, -1.0]], [[900, "x"]], [[True, 80.0]], [[900]]):
        doc = span_merge.encode_share(_stages(profile, {0}), {}).replace(
            b'"waiting_w": []',
            b'"waiting_w": ' + json.dumps(bad).encode(),
        )
        with pytest.raises(span_merge.ShareError):
            span_merge.decode_share(doc)


def test_the_solution_round_trips_and_bad_documents_are_refused() -> None:
    profile = synthetic_profile(2, seed=4, clocks_mhz=(1410, 1200, 1000))
    shape = JobShape("1f1b", 2, 2, 1)
    orders = shape.named_orders()
    assert orders is not None
    task = SolveInput("j", shape, orders, profile_to_csv(profile), "p", 80.0, auto_unit_time_s(profile))
    frontier = solve(task).frontier
    again, merged, p_block_w = span_merge.decode_solution(
        span_merge.encode_solution(frontier, profile, 80.0), "solution"
    )
    assert again == frontier
    assert (merged.measurements, p_block_w) == (profile.measurements, 80.0)
    for bad in (b"not json", b'{"format": "perseus-span-share", "version": 1}', b'{"format": "x"}'):
        with pytest.raises(span_merge.ShareError):
            span_merge.decode_solution(bad, "bad")
    with pytest.raises(span_merge.ShareError):
        span_merge.decode_share(
            b'{"format": "perseus-span-share", "version": 1, "rows": [[0, "forward", 1, -1, 1]]}'
        )


def _member(
    node: str, slots: tuple[tuple[int, int], ...], spans: tuple[PipelineSpan, ...] = ()
) -> MemberRecord:
    identity = JobIdentity("j", 0, "1f1b", 4, 4, 1, 1, "")
    return MemberRecord(node, identity, slots, "profiling", spans=spans)


def test_coverage_what_is_missing_and_each_pipelines_step_over_nodes() -> None:
    job = Job("j", 0, SHAPE, "gpu", "sig", Policy())
    members = {
        "a": _member("a", ((0, 0), (0, 1), (1, 0)), (PipelineSpan(0, 9, 2.0), PipelineSpan(1, 9, 2.2))),
        "b": _member("b", ((0, 2), (0, 3), (1, 3)), (PipelineSpan(0, 8, 2.5),)),
    }
    assert covered_pipelines(job, members) == [0]
    assert missing_text(job, members) == "pipeline 1: stages 1-2 on no node seen"
    # Pipeline 0: node b is a step behind and its part is the longer; pipeline 1 waits for node b's report.
    assert merged_spans(members) == {0: (8, 2.5)}
    members["c"] = _member("c", ((0, 3),))
    assert "pipeline 0 stage 3 on b and c" in missing_text(job, members)
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"

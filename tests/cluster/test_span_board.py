"""What the nodes of a spanning job share through etcd, without etcd: identity keys, records, plans, blobs,
and a job view that skips what it cannot decode."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from perseusd.cluster.job_board import build_full_view, build_view, job_prefix
from perseusd.cluster.span_board import (
    JobIdentity,
    MemberRecord,
    PipelinePlan,
    PipelineSpan,
    PlanRecord,
    ProfileShare,
    StragglerPlan,
    blob_chunks,
    decode_member,
    decode_plan,
    encode_leader,
    encode_member,
    encode_plan,
    join_blob,
    leader_key,
    member_key,
    plan_key,
)

PREFIX = "/perseus/v1"
IDENTITY = JobIdentity("gpt3 run (7)", 1000, "1f1b", 8, 12, 1, 2, "slurm-42")


def test_the_identity_key_is_one_etcd_key_component_and_changes_with_any_field() -> None:
    key = IDENTITY.key()
    assert key.startswith("job-")
    assert "/" not in key
    assert job_prefix(PREFIX, key) == f"{PREFIX}/jobs/{key}/"  # any job name works: the key is a digest
    others = [
        JobIdentity("gpt3 run (8)", 1000, "1f1b", 8, 12, 1, 2, "slurm-42"),
        JobIdentity("gpt3 run (7)", 1001, "1f1b", 8, 12, 1, 2, "slurm-42"),
        JobIdentity("gpt3 run (7)", 1000, "1f1b", 8, 12, 1, 1, "slurm-42"),
        JobIdentity("gpt3 run (7)", 1000, "1f1b", 8, 12, 1, 2, "slurm-43"),
    ]
    assert len({key, *(o.key() for o in others)}) == 5
    assert JobIdentity.from_doc(IDENTITY.to_doc()) == IDENTITY


def _member(node: str = "node-a") -> MemberRecord:
    blob, _ = blob_chunks(f"profile-{node}", b"rows")
    return MemberRecord(
        node=node,
        identity=IDENTITY,
        slots=((0, 0), (0, 1), (1, 0)),
        state="running",
        profiling_iterations=42,
        profiling_energy_j=12345.6,
        profile=ProfileShare(blob, 160.0, 0.011),
        measured_j=6220.0,
        measured_all_max_j=7340.0,
        spans=(PipelineSpan(0, 17, 2.83), PipelineSpan(1, 16, 2.84)),
        error="",
        policy="slowdown",
        target=0.05,
        policy_since=1700000000.5,
        clock_latency_s=0.0123,
    )


def test_member_and_plan_records_round_trip() -> None:
    member = _member()
    assert decode_member(encode_member(member).encode()) == member
    plan = PlanRecord(
        node="node-b",
        epoch=3,
        solves=1,
        solution=blob_chunks("solution", b"x" * 10)[0],
        error="",
        base=812,
        pipelines=(PipelinePlan(0, 90, 40), PipelinePlan(1, 812, 0)),
        straggler=StragglerPlan(0, 1.2, "detected", 37),
    )
    assert decode_plan(encode_plan(plan).encode()) == plan
    assert plan.point_for(0) == PipelinePlan(0, 90, 40)
    assert plan.point_for(5) is None


def test_blobs_are_chunked_compressed_and_checked() -> None:
    data = random.Random(1).randbytes(1_000_000)  # incompressible: several chunks
    ref, chunks = blob_chunks("solution", data)
    assert ref.chunks == len(chunks) > 1
    assert join_blob(ref, {i: c.encode() for i, c in enumerate(chunks)}) == data
    with pytest.raises(ValueError, match="chunks"):
        join_blob(ref, {i: c.encode() for i, c in enumerate(chunks[:-1])})
    other_ref, other_chunks = blob_chunks("solution", b"another")
    with pytest.raises(ValueError, match="digest mismatch"):
        join_blob(dataclasses.replace(ref, chunks=1), {0: other_chunks[0].encode()})
    assert other_ref.digest != ref.digest


def test_a_job_view_decodes_span_records_and_skips_what_it_cannot() -> None:
    key = IDENTITY.key()
    entries = [
        (member_key(PREFIX, key, "node-a"), encode_member(_member("node-a")).encode()),
        (member_key(PREFIX, key, "node-b"), encode_member(_member("node-a")).encode()),  # under another's key
        (member_key(PREFIX, key, "node-c"), b'{"version": 1, "node": "node-c"}'),  # incomplete
        (member_key(PREFIX, key, "node-d"), json.dumps({"version": 2}).encode()),  # a newer version
        (leader_key(PREFIX, key), encode_leader("node-a").encode()),
        (plan_key(PREFIX, key), b"not json"),
        (f"{PREFIX}/jobs/{key}/pipelines/0", b'{"version": 1}'),
    ]
    pipelines, stragglers, span, skipped = build_full_view(key, PREFIX, entries)
    assert (pipelines, stragglers) == ({}, {})
    assert span is not None
    assert list(span.members) == ["node-a"]
    assert (span.leader, span.plan) == ("node-a", None)
    assert skipped == 5
    assert build_view(key, PREFIX, entries)[2] == 5  # the older reader counts the same skips


def test_names_that_cannot_be_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="must match"):
        member_key(PREFIX, "a/b", "node-a")
    with pytest.raises(ValueError, match="must match"):
        encode_leader("bad node")

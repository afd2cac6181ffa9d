"""What the nodes of a spanning job share through etcd, without etcd: identity keys, records, plans, blobs,
and a job view that skips what it cannot decode."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from perseusd.cluster import span_blobs, span_codec
from perseusd.cluster import span_board as board
from perseusd.cluster.job_board import build_full_view, build_view
from perseusd.cluster.span_board import job_prefix

PREFIX = "/perseus/v1"
IDENTITY = board.JobIdentity("gpt3 run (7)", 1000, "1f1b", 8, 12, 1, 2, "slurm-42")


def test_the_identity_key_is_one_etcd_key_component_and_changes_with_any_field() -> None:
    key = IDENTITY.key()
    assert key.startswith("job-")
    assert "/" not in key
    assert job_prefix(PREFIX, key) == f"{PREFIX}/jobs/{key}/"  # any job name works: the key is a digest
    others = [
        board.JobIdentity("gpt3 run (8)", 1000, "1f1b", 8, 12, 1, 2, "slurm-42"),
        board.JobIdentity("gpt3 run (7)", 1001, "1f1b", 8, 12, 1, 2, "slurm-42"),
        board.JobIdentity("gpt3 run (7)", 1000, "1f1b", 8, 12, 1, 1, "slurm-42"),
        board.JobIdentity("gpt3 run (7)", 1000, "1f1b", 8, 12, 1, 2, "slurm-43"),
    ]
    assert len({key, *(o.key() for o in others)}) == 5
    assert board.JobIdentity.from_doc(IDENTITY.to_doc()) == IDENTITY


def _member(node: str = "node-a") -> board.MemberRecord:
    blob, _ = span_blobs.blob_chunks(f"profile-{node}", b"rows")
    return board.MemberRecord(
        node=node,
        identity=IDENTITY,
        slots=((0, 0), (0, 1), (1, 0)),
        state="running",
        profiling_iterations=42,
        profiling_energy_j=12345.6,
        profile=board.ProfileShare(blob, 160.0, 0.011),
        measured_j=6220.0,
        measured_all_max_j=7340.0,
        spans=(board.PipelineSpan(0, 17, 2.83), board.PipelineSpan(1, 16, 2.84)),
        error="",
        policy="slowdown",
        target=0.05,
        policy_since=1700000000.5,
        clock_latency_s=0.0123,
    )


def test_member_and_plan_records_round_trip() -> None:
    member = _member()
    assert span_codec.decode_member(span_codec.encode_member(member).encode()) == member
    plan = board.PlanRecord(
        node="node-b",
        epoch=3,
        solves=1,
        solution=span_blobs.blob_chunks("solution", b"x" * 10)[0],
        error="",
        base=812,
        pipelines=(board.PipelinePlan(0, 90, 40), board.PipelinePlan(1, 812, 0)),
        straggler=board.StragglerPlan(0, 1.2, "detected", 37),
    )
    assert span_codec.decode_plan(span_codec.encode_plan(plan).encode()) == plan
    assert plan.point_for(0) == board.PipelinePlan(0, 90, 40)
    assert plan.point_for(5) is None


def test_blobs_are_chunked_compressed_and_checked() -> None:
    data = random.Random(1).randbytes(1_000_000)  # incompressible: several chunks
    ref, chunks = span_blobs.blob_chunks("solution", data)
    assert ref.chunks == len(chunks) > 1
    assert span_blobs.join_blob(ref, {i: c.encode() for i, c in enumerate(chunks)}) == data
    with pytest.raises(ValueError, match="chunks"):
        span_blobs.join_blob(ref, {i: c.encode() for i, c in enumerate(chunks[:-1])})
    other_ref, other_chunks = span_blobs.blob_chunks("solution", b"another")
    with pytest.raises(ValueError, match="digest mismatch"):
        span_blobs.join_blob(dataclasses.replace(ref, chunks=1), {0: other_chunks[0].encode()})
    assert other_ref.digest != ref.digest


def test_a_job_view_decodes_span_records_and_skips_what_it_cannot() -> None:
    key = IDENTITY.key()
    entries = [
        (board.member_key(PREFIX, key, "node-a"), span_codec.encode_member(_member("node-a")).encode()),
        # node-a's record under node-b's key:
        (board.member_key(PREFIX, key, "node-b"), span_codec.encode_member(_member("node-a")).encode()),
        (board.member_key(PREFIX, key, "node-c"), b'{"version": 1, "node": "node-c"}'),  # incomplete
        (board.member_key(PREFIX, key, "node-d"), json.dumps({"version": 2}).encode()),  # a newer version
        (board.leader_key(PREFIX, key), span_codec.encode_leader("node-a").encode()),
        (board.plan_key(PREFIX, key), b"not json"),
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
        board.member_key(PREFIX, "a/b", "node-a")
    with pytest.raises(ValueError, match="must match"):
        span_codec.encode_leader("bad node")

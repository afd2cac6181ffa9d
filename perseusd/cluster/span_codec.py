"""The JSON values of a spanning job's member, leader and plan keys (`span_board`): each record written as
one `{"version": 1, ...}` object, and read back, with ValueError for anything this version does not
understand (another node may run a newer one: the job view skips and counts such values).
"""

from __future__ import annotations

import json
from typing import Any

from perseusd.cluster.span_board import (
    BlobRef,
    JobIdentity,
    MemberRecord,
    PipelinePlan,
    PipelineSpan,
    PlanRecord,
    ProfileShare,
    StragglerPlan,
    check_name,
)
from perseusd.cluster.span_fields import (
    float_field,
    int_field,
    object_doc,
    optional_float_field,
    plain_float,
    plain_int,
    str_field,
)

SPAN_VERSION = 1
MAX_SLOTS = 100_000


# -- encoding -----------------------------------------------------------------------------------------------


def encode_member(record: MemberRecord) -> str:
    doc: dict[str, Any] = {
        "version": SPAN_VERSION,
        "node": record.node,
        "identity": record.identity.to_doc(),
        "slots": [list(slot) for slot in record.slots],
        "state": record.state,
        "profiling_iterations": record.profiling_iterations,
        "profiling_energy_j": record.profiling_energy_j,
        "measured_j": record.measured_j,
        "measured_all_max_j": record.measured_all_max_j,
        "spans": [[s.pipeline, s.step, s.compute_s] for s in record.spans],
        "error": record.error,
        "policy": [record.policy, record.target, record.policy_since],
        "clock_latency_s": record.clock_latency_s,
    }
    if record.profile is not None:
        doc["profile"] = {
            "blob": record.profile.blob.to_doc(),
            "p_block_w": record.profile.p_block_w,
            "iteration_overhead_s": record.profile.iteration_overhead_s,
        }
    return json.dumps(doc, sort_keys=True)


def encode_leader(node: str) -> str:
    return json.dumps({"version": SPAN_VERSION, "node": check_name("node", node)}, sort_keys=True)


def encode_plan(plan: PlanRecord) -> str:
    doc: dict[str, Any] = {
        "version": SPAN_VERSION,
        "node": plan.node,
        "epoch": plan.epoch,
        "solves": plan.solves,
        "solution": None if plan.solution is None else plan.solution.to_doc(),
        "error": plan.error,
        "base": plan.base,
        "pipelines": [[p.pipeline, p.point, p.from_step] for p in plan.pipelines],
        "straggler": None
        if plan.straggler is None
        else [
            plan.straggler.pipeline,
            plan.straggler.factor,
            plan.straggler.source,
            plan.straggler.since_step,
        ],
    }
    return json.dumps(doc, sort_keys=True)


# -- decoding (ValueError for anything this version does not understand) ----------------------------------


def decode_member(raw: bytes) -> MemberRecord:
    doc = _document(raw)
    slots = doc.get("slots")
    if not isinstance(slots, list) or len(slots) > MAX_SLOTS:
        raise ValueError("slots is not a list")
    profile = doc.get("profile")
    spans = doc.get("spans", [])
    if not isinstance(spans, list):
        raise ValueError("spans is not a list")
    return MemberRecord(
        node=check_name("node", str_field(doc, "node")),
        identity=JobIdentity.from_doc(doc.get("identity")),
        slots=tuple(_int_pair(slot) for slot in slots),
        state=str_field(doc, "state"),
        profiling_iterations=int_field(doc, "profiling_iterations"),
        profiling_energy_j=float_field(doc, "profiling_energy_j"),
        profile=None if profile is None else _profile_share(profile),
        measured_j=optional_float_field(doc, "measured_j"),
        measured_all_max_j=optional_float_field(doc, "measured_all_max_j"),
        spans=tuple(_span(item) for item in spans),
        error=str_field(doc, "error"),
        **_policy(doc.get("policy")),
        clock_latency_s=optional_float_field(doc, "clock_latency_s"),
    )


def decode_leader(raw: bytes) -> str:
    return check_name("node", str_field(_document(raw), "node"))


def decode_plan(raw: bytes) -> PlanRecord:
    doc = _document(raw)
    pipelines = doc.get("pipelines")
    if not isinstance(pipelines, list):
        raise ValueError("pipelines is not a list")
    solution = doc.get("solution")
    straggler = doc.get("straggler")
    return PlanRecord(
        node=check_name("node", str_field(doc, "node")),
        epoch=int_field(doc, "epoch"),
        solves=int_field(doc, "solves"),
        solution=None if solution is None else BlobRef.from_doc(solution),
        error=str_field(doc, "error"),
        base=int_field(doc, "base"),
        pipelines=tuple(_pipeline_plan(item) for item in pipelines),
        straggler=None if straggler is None else _straggler_plan(straggler),
    )


def _profile_share(doc: Any) -> ProfileShare:
    doc = object_doc(doc, "profile")
    return ProfileShare(
        BlobRef.from_doc(doc.get("blob")),
        float_field(doc, "p_block_w"),
        optional_float_field(doc, "iteration_overhead_s"),
    )


def _policy(item: Any) -> dict[str, Any]:
    if not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], str):
        raise ValueError("a policy is [name, target, since]")
    return {"policy": item[0], "target": plain_float(item[1]), "policy_since": plain_float(item[2])}


def _span(item: Any) -> PipelineSpan:
    if not isinstance(item, list) or len(item) != 3:
        raise ValueError("a span is [pipeline, step, compute_s]")
    pipeline, step = plain_int(item[0]), plain_int(item[1])
    return PipelineSpan(pipeline, step, plain_float(item[2]))


def _pipeline_plan(item: Any) -> PipelinePlan:
    if not isinstance(item, list) or len(item) != 3:
        raise ValueError("a pipeline plan is [pipeline, point, from_step]")
    return PipelinePlan(*(plain_int(v) for v in item))


def _straggler_plan(item: Any) -> StragglerPlan:
    if not isinstance(item, list) or len(item) != 4 or not isinstance(item[2], str):
        raise ValueError("a straggler is [pipeline, factor, source, since_step]")
    return StragglerPlan(plain_int(item[0]), plain_float(item[1]), item[2], plain_int(item[3]))


def _int_pair(item: Any) -> tuple[int, int]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError("a slot is [pipeline, stage]")
    return plain_int(item[0]), plain_int(item[1])


def _document(raw: bytes) -> dict[str, Any]:
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("version") != SPAN_VERSION:
        raise ValueError("not a version 1 object")
    return doc

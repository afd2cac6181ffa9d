"""The nodes' records of a spanning job read together: which are the job's, which stages this node runs,
which pipelines the nodes cover and what no node runs yet, and each pipeline's step as all its nodes reported
it. The coordinator (`perseusd.jobs.spanning`) and its leader read the view through these, and so does
`perseusctl jobs` (`perseusd.jobs.span_report`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from perseusd.cluster.span_board import MemberRecord, PipelineSpan
from perseusd.jobs.job import Job
from perseusd.jobs.span_state import SpanState


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

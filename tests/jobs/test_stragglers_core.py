"""Straggler response inside a daemon core (no sockets): detection with hysteresis from step events,
re-planning at one step boundary on every stage, announcements, recovery and the energy saved."""

from __future__ import annotations

import time

import pytest
from perseus_client.protocol import AnnounceStraggler, AnnounceStragglerOk, ErrorCode, ProtocolError

from perseusd.daemon.core import DaemonCore
from perseusd.jobs.straggling import NOISE_MIN_SAMPLES
from tests.support.callers import ME, OTHER
from tests.support.daemon_core import core_job, running_core_fixture
from tests.support.pipeline_steps import S_NS, pipeline_step

pytestmark = pytest.mark.timeout(120)

PIPELINES, STAGES, MICROBATCHES = 3, 2, 4


core = running_core_fixture(PIPELINES, STAGES, MICROBATCHES)


def _gpu(core: DaemonCore, pipeline: int, stage: int) -> str:
    return core.registry.uuids[pipeline * STAGES + stage]


def _steps(core: DaemonCore, first: int, count: int, slowness: dict[int, float]) -> int:
    """`count` synchronised steps; pipeline p's compute time is slowness[p] (default 1) x its plan's time."""
    info = core_job(core)
    plan_s = {p.pipeline: p.plan_time_s for p in info.pipelines}
    start_ns = time.monotonic_ns()
    for step in range(first, first + count):
        longest_s = 0.0
        for pipeline in range(PIPELINES):
            current = {p.pipeline: p.plan_time_s for p in core_job(core).pipelines}
            compute_s = (current[pipeline] or plan_s[pipeline] or 1.0) * slowness.get(pipeline, 1.0)
            pipeline_step(core, pipeline, step, start_ns, compute_s, stages=STAGES, microbatches=MICROBATCHES)
            longest_s = max(longest_s, compute_s)
        start_ns += round(longest_s * S_NS) + 1000
    return first + count


def _plans(core: DaemonCore) -> dict[int, int | None]:
    return {p.pipeline: p.plan_index for p in core_job(core).pipelines}


def test_a_detected_straggler_slows_the_others_at_one_boundary_and_recovery_restores_them(
    core: DaemonCore,
) -> None:
    fastest = core_job(core)
    assert fastest.all_max_time_s is not None
    assert fastest.fastest_time_s is not None
    fastest_index = fastest.plan_index
    step = _steps(core, 0, NOISE_MIN_SAMPLES, {})  # healthy steps first: each pipeline's noise is known
    assert core_job(core).straggler is None
    assert set(_plans(core).values()) == {fastest_index}
    assert all(p.slowness == pytest.approx(1.0, abs=0.01) for p in core_job(core).pipelines)

    step = _steps(core, step, 2, {1: 1.3})  # two slow steps: not yet (hysteresis)
    assert core_job(core).straggler is None
    step = _steps(core, step, 1, {1: 1.3})
    info = core_job(core)
    assert info.straggler is not None
    detected_at = step - 1
    assert (info.straggler.pipeline, info.straggler.source, info.straggler.since_step) == (
        1,
        "detected",
        detected_at,
    )
    assert info.straggler.factor == pytest.approx(1.3, rel=0.01)
    assert info.target_time_s == pytest.approx(1.3 * fastest.fastest_time_s, rel=0.01)

    step = _steps(core, step, 1, {1: 1.3})
    info = core_job(core)
    by_pipeline = {p.pipeline: p for p in info.pipelines}
    assert by_pipeline[1].plan_index == fastest_index  # the straggler itself runs the fastest point
    for pipeline in (0, 2):
        moved = by_pipeline[pipeline]
        assert moved.plan_index != fastest_index
        # the first step none of its stages had begun (pipeline 2 had not begun the detection step yet)
        assert moved.plan_since_step == detected_at + (1 if pipeline == 0 else 0)
        assert moved.plan_time_s is not None
        assert info.target_time_s is not None
        assert fastest.fastest_time_s < moved.plan_time_s <= info.target_time_s + 1e-9
        for stage in range(STAGES):
            assert core.plans.get(_gpu(core, pipeline, stage)) is not None
    assert info.energy_saved_j > 0

    step = _steps(core, step, 4, {1: 1.3})  # slowed pipelines measured against their own plan: no cascade
    assert core_job(core).straggler is not None
    assert core_job(core).straggler.pipeline == 1
    step = _steps(core, step, 2, {})
    assert core_job(core).straggler is not None  # two healthy steps: still straggling (hysteresis)
    step = _steps(core, step, 2, {})
    assert core_job(core).straggler is None
    step = _steps(core, step, 1, {})
    assert set(_plans(core).values()) == {fastest_index}


def test_announcements_replan_and_clear(core: DaemonCore) -> None:
    fastest = core_job(core)
    step = _steps(core, 0, 2, {})
    reply = core.handle(ME, AnnounceStraggler("train", 2, 1.2, False))
    assert isinstance(reply, AnnounceStragglerOk)
    assert (reply.pipeline, reply.factor, reply.clear, reply.shared) == (2, 1.2, False, False)
    info = core_job(core)
    assert info.straggler is not None
    assert (info.straggler.pipeline, info.straggler.source) == (2, "announced")
    _steps(core, step, 1, {2: 1.2})
    plans = _plans(core)
    assert plans[2] == fastest.plan_index
    assert plans[0] == plans[1] != fastest.plan_index

    cleared = core.handle(ME, AnnounceStraggler("train", 2, 0.0, True))
    assert isinstance(cleared, AnnounceStragglerOk)
    assert cleared.clear
    assert core_job(core).straggler is None
    assert set(_plans(core).values()) == {fastest.plan_index}  # between steps: switched at once


def test_bad_announcements_are_refused(core: DaemonCore) -> None:
    with pytest.raises(ProtocolError) as low:
        core.handle(ME, AnnounceStraggler("train", 0, 0.5, False))
    assert low.value.code == ErrorCode.BAD_FIELD
    with pytest.raises(ProtocolError) as stranger:
        core.handle(OTHER, AnnounceStraggler("train", 0, 1.2, False))
    assert (stranger.value.code, stranger.value.message) == (
        ErrorCode.PERMISSION_DENIED,
        "job 'train' belongs to another user",
    )
    with pytest.raises(ProtocolError, match="no job 'nope'"):
        core.handle(ME, AnnounceStraggler("nope", 0, 1.2, False))
    assert core_job(core).straggler is None

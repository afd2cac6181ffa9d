"""Straggler detection under CPU noise (two pipelines, as on a loaded machine): at most one re-plan per real
change, none for noise alone, and an announced straggler overrides a detected one."""

from __future__ import annotations

import random
import time

import pytest
from perseus_client.protocol import AnnounceStraggler

from perseusd.daemon.core import DaemonCore
from perseusd.jobs.straggling import (
    NOISE_MARGIN_MAX,
    NOISE_MIN_SAMPLES,
    NOISE_SAMPLES,
    ActiveStraggler,
    Detector,
    StragglerSettings,
    pick_straggler,
)
from tests.support.callers import ME
from tests.support.daemon_core import core_job, running_core_fixture
from tests.support.pipeline_steps import S_NS, pipeline_step

pytestmark = pytest.mark.timeout(300)

PIPELINES, STAGES, MICROBATCHES = 2, 2, 4


core = running_core_fixture(PIPELINES, STAGES, MICROBATCHES)


class CpuNoise:
    """Per-step slowdowns like those of emulated pipelines on a loaded 2-core machine: jitter of a few per
    cent on every step and bursts of one or two steps up to 15 % slower (another process took the core)."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._burst: dict[int, int] = {}

    def factor(self, pipeline: int) -> float:
        jitter = 1.0 + self._random.gauss(0.0, 0.03)
        left = self._burst.get(pipeline, 0)
        if left == 0 and self._random.random() < 0.08:
            left = self._random.choice((1, 2))
        self._burst[pipeline] = max(0, left - 1)
        return jitter * (1.0 + self._random.uniform(0.06, 0.15) if left else jitter)


def _step(core: DaemonCore, step: int, start_ns: int, slowness: dict[int, float]) -> int:
    """One synchronised step; returns the next step's start (after the slowest pipeline)."""
    plans = {p.pipeline: p.plan_time_s for p in core_job(core).pipelines}
    longest_s = 0.0
    for pipeline in range(PIPELINES):
        compute_s = (plans[pipeline] or 1.0) * slowness[pipeline]
        pipeline_step(core, pipeline, step, start_ns, compute_s, stages=STAGES, microbatches=MICROBATCHES)
        longest_s = max(longest_s, compute_s)
    return start_ns + round(longest_s * S_NS) + 1000


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noise_causes_no_replan_and_a_real_straggler_exactly_one_each_way(
    core: DaemonCore, seed: int
) -> None:
    noise = CpuNoise(seed)
    job = core.jobs.jobs["train"]  # type: ignore[union-attr]
    start_ns = time.monotonic_ns()
    detected: list[tuple[int, int]] = []  # (step, pipeline) whenever the planned-for straggler changes
    last = None
    phases = [(0, 80, 1.0), (80, 120, 1.25), (120, 200, 1.0)]  # pipeline 0 really slowed x1.25 in the middle
    for first, end, real in phases:
        for step in range(first, end):
            slowness = {p: noise.factor(p) * (real if p == 0 else 1.0) for p in range(PIPELINES)}
            start_ns = _step(core, step, start_ns, slowness)
            current = core_job(core).straggler
            key = None if current is None else current.pipeline
            if key != last:
                detected.append((step, -1 if key is None else key))
                last = key
        if first == 0:
            assert job.replans == 0, f"noise alone re-planned: {detected}"
            assert detected == []
    assert [pipeline for _, pipeline in detected] == [0, -1], detected
    onset, recovery = detected[0][0], detected[1][0]
    assert 80 <= onset < 90
    assert 120 <= recovery < 140
    assert job.replans == 2


def test_announced_straggler_overrides_a_detected_one(core: DaemonCore) -> None:
    start_ns = time.monotonic_ns()
    for step in range(NOISE_MIN_SAMPLES):  # healthy steps: each pipeline's noise is known
        start_ns = _step(core, step, start_ns, {0: 1.0, 1: 1.0})
    for step in range(NOISE_MIN_SAMPLES, NOISE_MIN_SAMPLES + 3):  # pipeline 1 really slow: detected
        start_ns = _step(core, step, start_ns, {0: 1.0, 1: 1.4})
    info = core_job(core)
    assert info.straggler is not None
    assert (info.straggler.pipeline, info.straggler.source) == (1, "detected")
    core.handle(ME, AnnounceStraggler("train", 0, 1.1, False))  # the operator knows better
    info = core_job(core)
    assert info.straggler is not None
    assert (info.straggler.pipeline, info.straggler.source, info.straggler.factor) == (0, "announced", 1.1)
    start_ns = _step(core, step + 1, start_ns, {0: 1.0, 1: 1.4})
    plans = {p.pipeline: p.plan_index for p in core_job(core).pipelines}
    assert plans[0] == info.plan_index  # the announced straggler runs the fastest point
    assert plans[1] != info.plan_index


def test_pick_straggler_prefers_announced_then_slowest() -> None:
    detected = ActiveStraggler(1, 1.5, "detected", 3)
    cluster = ActiveStraggler(2, 1.6, "cluster", 3)
    announced = ActiveStraggler(0, 1.1, "announced", 4)
    assert pick_straggler([detected, cluster]) == cluster
    assert pick_straggler([detected, announced, cluster]) == announced
    assert pick_straggler([]) is None


def test_a_pipeline_slow_from_the_start_is_still_detected() -> None:
    detector = Detector(StragglerSettings())
    changes = [detector.observe(1.3) for _ in range(NOISE_MIN_SAMPLES + 1)]
    assert changes.index(True) == NOISE_MIN_SAMPLES - 1  # as soon as it may be judged
    assert detector.factor == pytest.approx(1.3)


def test_noise_margin_is_capped_so_a_clear_straggler_is_caught_on_a_very_noisy_machine() -> None:
    detector = Detector(StragglerSettings())
    rng = random.Random(7)
    for _ in range(NOISE_SAMPLES):
        detector.observe(1.0 + rng.gauss(0.0, 0.2))  # a very noisy machine
    assert detector.margin() == NOISE_MARGIN_MAX
    assert any(detector.observe(1.5) for _ in range(3))

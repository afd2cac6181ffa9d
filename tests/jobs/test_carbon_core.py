"""The carbon policy inside a daemon core (no sockets): each interval the point of least Chase cost for the
forecast, within the allowed slowdown, switched at an iteration boundary; the default point while the signal
is unusable; carbon counted from the energy counters, all-max beside it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from perseus_client.protocol import (
    AnnounceStraggler,
    DocumentReply,
    FrontierRequest,
    JobInfo,
    SetPolicy,
    StepBegin,
    StepEnd,
)

from perseusd.carbon.choice import ChaseWeights, allowed_points, choose_point
from perseusd.carbon.keeper import SignalKeeper
from perseusd.carbon.traces import SignalPoint
from perseusd.daemon.core import DaemonCore
from perseusd.jobs.carbon_steering import CarbonSettings, CarbonSteering
from perseusd.planner.policy import PointSummary, Policy
from tests.support.callers import ME
from tests.support.daemon_core import MICROBATCHES, STAGES, core_job, running_core

pytestmark = pytest.mark.timeout(120)

SETTINGS = CarbonSettings(interval_s=1800.0, eta=0.9, reference_intensity=1000.0)
ALLOWED_SLOWDOWN = 0.3


class World:
    """The test's clock (for the keeper and the steering) and the signal's history."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.keeper = SignalKeeper("test", "gCO2eq/kWh", 3600.0, "persistence", clock_s=lambda: self.now_s)

    def grid(self, value: float) -> None:
        self.keeper.update([SignalPoint(1800.0 * i, value) for i in range(4)])


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture(params=[1])
def core(tmp_path: Path, world: World, request: pytest.FixtureRequest) -> Iterator[DaemonCore]:
    pipelines: int = request.param
    steering = CarbonSteering(world.keeper, SETTINGS, clock_s=lambda: world.now_s)
    with running_core(tmp_path, pipelines, STAGES, MICROBATCHES, carbon=steering) as built:
        yield built


def _points(core: DaemonCore) -> list[PointSummary]:
    reply = core.handle(ME, FrontierRequest("train"))
    assert isinstance(reply, DocumentReply)
    document = json.loads(reply.document)
    return [
        PointSummary(
            int(p["index"]), float(p.get("refined_time_s", p["time_s"])), float(p["refined_energy_j"])
        )
        for p in document["points"]
    ]


def _expected(core: DaemonCore, intensity: float) -> PointSummary:
    info = core_job(core)
    assert info.all_max_time_s is not None
    allowed = allowed_points(_points(core), info.all_max_time_s * (1 + ALLOWED_SLOWDOWN))
    power_w = STAGES * core.registry.info(core.registry.uuids[0]).power_limit_max_w
    return choose_point(allowed, intensity, ChaseWeights(SETTINGS.eta, SETTINGS.reference_intensity, power_w))


def _step(core: DaemonCore, step: int) -> None:
    """Every stage of every pipeline begins and ends `step` (an iteration boundary: switches apply)."""
    for gpu in core.registry.uuids:
        core.on_event(ME, StepBegin(gpu, step, time.monotonic_ns()))
        core.on_event(ME, StepEnd(gpu, step, time.monotonic_ns()))


def _carbon_policy(core: DaemonCore, world: World, intensity: float) -> JobInfo:
    """The grid at `intensity`, then the job switched to the carbon policy: the job as it runs then."""
    world.grid(intensity)
    core.handle(ME, SetPolicy("train", "carbon", ALLOWED_SLOWDOWN))
    return core_job(core)


def _next_interval(core: DaemonCore, world: World, intensity: float) -> None:
    """The grid at `intensity` and the next carbon interval begun (the steering chooses again)."""
    world.grid(intensity)
    world.now_s += SETTINGS.interval_s
    core.tick()


def test_the_point_follows_the_forecast_each_interval_within_the_allowed_slowdown(
    core: DaemonCore, world: World
) -> None:
    dirty = _carbon_policy(core, world, 2000.0)  # a dirty grid
    assert dirty.policy == "carbon"
    assert dirty.target == ALLOWED_SLOWDOWN
    assert dirty.plan_index == _expected(core, 2000.0).index
    assert dirty.carbon is not None
    assert dirty.carbon.basis == "forecast 2000.0 gCO2eq/kWh"
    assert dirty.all_max_time_s is not None
    assert dirty.plan_time_s is not None
    assert dirty.plan_time_s <= dirty.all_max_time_s * (1 + ALLOWED_SLOWDOWN) * (1 + 1e-9)

    world.grid(5.0)  # the grid turns clean, but the interval has not passed: nothing moves
    world.now_s += 600.0
    core.tick()
    assert core_job(core).plan_index == dirty.plan_index

    world.now_s += 1200.0  # the next interval
    core.tick()
    _step(core, 0)
    clean = core_job(core)
    assert clean.plan_index == _expected(core, 5.0).index
    assert clean.plan_time_s is not None
    assert clean.plan_time_s < dirty.plan_time_s
    assert clean.pipelines[0].plan_index == clean.plan_index  # switched at the iteration boundary


def test_an_expired_signal_falls_back_to_the_default_point_and_says_so(
    core: DaemonCore, world: World
) -> None:
    default = _carbon_policy(core, world, 2000.0)
    world.now_s += 3601.0  # no fetch for longer than the bounded age
    world.keeper.failed("the API is down")
    core.tick()
    _step(core, 0)
    info = core_job(core)
    assert info.carbon is not None
    assert info.carbon.basis == "default (signal expired)"
    points = _points(core)
    assert info.all_max_time_s is not None
    expected = Policy("no_slowdown").choose(points, info.all_max_time_s)
    assert info.plan_index == expected.index != default.plan_index


def test_carbon_is_counted_from_the_counters_with_all_max_beside_it(core: DaemonCore, world: World) -> None:
    world.grid(500.0)
    deadline_s = time.monotonic() + 30
    step = 0
    while True:
        _step(core, step)
        step += 1
        core.tick()
        carbon = core_job(core).carbon
        assert carbon is not None
        if carbon.carbon_g > 0 and carbon.all_max_carbon_g:
            break
        assert time.monotonic() < deadline_s, "no carbon was counted"
        time.sleep(0.1)
    assert carbon.carbon_g == pytest.approx(carbon.energy_j / 3.6e6 * 500.0, rel=1e-3)  # info rounds to 1 µg
    assert carbon.all_max_basis == "predicted"  # an imported profile: all-max was never measured
    assert carbon.basis == ""  # not a carbon job


@pytest.mark.parametrize("core", [2], indirect=True)
def test_straggler_slack_comes_first_and_never_runs_faster_than_the_carbon_point(
    core: DaemonCore, world: World
) -> None:
    clean = _carbon_policy(core, world, 5.0)  # clean: the carbon point is fast
    assert clean.plan_time_s is not None
    core.handle(ME, AnnounceStraggler("train", 1, 1.25, False))
    _step(core, 0)
    info = core_job(core)
    plans = {p.pipeline: p for p in info.pipelines}
    assert plans[1].plan_index == Policy("fastest").choose(_points(core)).index  # the straggler: fastest
    slack = plans[0].plan_time_s
    assert slack is not None
    assert (
        slack > clean.plan_time_s
    )  # the other pipeline uses the slack: slower, cheaper than the carbon point

    _next_interval(core, world, 2000.0)  # dirty: a carbon point slower than the straggler's pace
    _step(core, 1)
    dirty = core_job(core)
    assert dirty.plan_time_s is not None
    assert dirty.plan_time_s > slack
    plans = {p.pipeline: p for p in dirty.pipelines}
    assert plans[0].plan_index == dirty.plan_index  # never faster than the carbon point


def test_under_a_node_cap_the_job_runs_the_least_cost_point_the_cap_allows(
    core: DaemonCore, world: World
) -> None:
    clean = _carbon_policy(core, world, 5.0)  # clean: the carbon point is fast
    points = sorted(_points(core), key=lambda p: p.time_s)
    fast = next(p for p in points if p.index == clean.plan_index)
    cap = next(p for p in points if p.time_s > fast.time_s * 1.05)  # a cap that forbids the clean point
    assert core.jobs is not None
    job = core.jobs.jobs["train"]
    job.cap_index = cap.index  # what the node cap's allocation sets (perseusd.cap.node_cap)
    core.jobs.response.decide(job)  # and what it calls then
    _step(core, 0)
    running = core_job(core).pipelines[0]
    assert running.plan_index != fast.index
    assert running.plan_time_s is not None
    assert running.plan_time_s >= cap.time_s * (1 - 1e-9)  # nothing the cap forbids
    all_max_s = clean.all_max_time_s
    assert all_max_s is not None
    allowed = allowed_points(_points(core), all_max_s * (1 + ALLOWED_SLOWDOWN))
    power_w = STAGES * core.registry.info(core.registry.uuids[0]).power_limit_max_w
    weights = ChaseWeights(SETTINGS.eta, SETTINGS.reference_intensity, power_w)
    under_cap = [p for p in allowed if p.time_s >= cap.time_s]
    assert running.plan_index == choose_point(under_cap, 5.0, weights).index  # the best the cap allows

    # Dirty: the carbon point is slower than the cap's, the cap no longer binds.
    _next_interval(core, world, 2000.0)
    _step(core, 1)
    dirty = core_job(core)
    assert dirty.pipelines[0].plan_index == dirty.plan_index == _expected(core, 2000.0).index
    assert dirty.plan_time_s is not None
    assert dirty.plan_time_s >= cap.time_s

    job.cap_index = None  # the cap is cleared; the grid turns clean: back to the fast point
    _next_interval(core, world, 5.0)
    _step(core, 2)
    assert core_job(core).pipelines[0].plan_index == fast.index

"""Two real daemons sharing one job through a real 3-member etcd: a straggler detected on one node slows the
other node's pipelines down, a dead node vanishes within the lease TTL, and losing etcd falls back to the
no-slowdown plan.

Each pipeline is one thread of this process with its own client, claimed GPU and 1-stage registration; the
threads meet at a barrier after every step (the gradient sync) and "compute" by sleeping for the plan's
time, times a slowness factor for the straggler. Profiles are imported, so the job runs at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from perseus_client.client import PerseusClient
from perseus_client.protocol import JobInfo

from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.schedule_orders import one_f_one_b_order
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.lockstep import Lockstep, cluster_env
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess
from tests.support.polling import wait_until
from tests.support.synthetic import synthetic_profile

pytestmark = [requires_etcd, pytest.mark.timeout(240)]

JOB = "dp-job"
MICROBATCHES = 2
TTL_S = 3
PROMPT_S = 1.0
"""Node B switches within this long of node A's detection: the announcement in etcd, node B's next
refresh (0.2 s), the next iteration boundary; far below the 3 s lease TTL a missed announcement waits for."""
CONTROL_TIMEOUT_S = 15.0  # a loaded machine may take seconds to answer; the test is about etcd, not speed
CLOCKS_MHZ = tuple(range(1410, 850, -45))
PROFILE_CSV = profile_to_csv(synthetic_profile(1, seed=5, clocks_mhz=CLOCKS_MHZ, base_time_s=0.02))


@dataclass
class Pipeline:
    """One data-parallel pipeline (1 stage) driven by a thread."""

    index: int
    daemon: DaemonProcess
    slowness: float = 1.0
    client: PerseusClient | None = None
    gpu: str = ""
    plan_s: float = 0.1
    errors: list[BaseException] = field(default_factory=list)


@pytest.fixture
def nodes(etcd: EtcdCluster) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    etcd.restart()
    started = []
    for name in ("node-a", "node-b"):
        started.append(DaemonProcess(DaemonDirs.create(), gpus=2, env=cluster_env(etcd, name, TTL_S)).start())
    try:
        yield started[0], started[1]
    finally:
        for daemon in started:
            daemon.stop()


def _job(daemon: DaemonProcess) -> JobInfo | None:
    with PerseusClient(daemon.dirs.runtime_dir, "observer", timeout_s=CONTROL_TIMEOUT_S) as client:
        return next((j for j in client.jobs().jobs if j.job == JOB), None)


def _join(pipeline: Pipeline) -> None:
    client = PerseusClient(pipeline.daemon.dirs.runtime_dir, JOB, timeout_s=CONTROL_TIMEOUT_S)
    free = [g.uuid for g in client.status().gpus if g.lease is None]
    (pipeline.gpu,) = client.claim(free[:1])
    client.profile_import(PROFILE_CSV, source="synthetic.csv", p_block_w=80.0)
    client.register(
        pipeline.gpu, stage=0, num_stages=1, num_microbatches=MICROBATCHES, pipeline=pipeline.index
    )
    pipeline.client = client


def _pipeline_step(pipeline: Pipeline, step: int) -> None:
    """One training step of `pipeline` (one stage): its 1F1B computations, in the plan's time times its
    slowness."""
    client = pipeline.client
    assert client is not None
    order = one_f_one_b_order(1, MICROBATCHES, 0)
    with client.step(pipeline.gpu, step):
        for instruction, microbatch, chunk in order:
            with client.computation(pipeline.gpu, 0, instruction.value, microbatch, chunk):
                time.sleep(pipeline.plan_s * pipeline.slowness / len(order))


def _training(pipelines: list[Pipeline]) -> Lockstep[Pipeline]:
    return Lockstep(pipelines, _pipeline_step, barrier_timeout_s=30.0).start()


def _running(pipelines: list[Pipeline]) -> None:
    for pipeline in pipelines:
        _join(pipeline)
    for daemon in {id(p.daemon): p.daemon for p in pipelines}.values():
        wait_until(lambda d=daemon: (_job(d) or _fail()).state == "running", 60, "the job runs")  # type: ignore[misc]
    info = _job(pipelines[0].daemon)
    assert info is not None
    assert info.fastest_time_s is not None
    for pipeline in pipelines:
        pipeline.plan_s = info.fastest_time_s


def _steps_within(duration_s: float, pipeline: Pipeline) -> int:
    """The steps a pipeline starts within `duration_s` at its planned pace, and the one under way (a step is
    never shorter than that: a loaded machine only makes the bound looser)."""
    return 1 + math.ceil(duration_s / pipeline.plan_s)


def _fail() -> JobInfo:
    raise AssertionError("the job is unknown to the daemon")


def _by_pipeline(info: JobInfo | None) -> dict[int, tuple[int | None, int | None, str]]:
    assert info is not None
    return {p.pipeline: (p.plan_index, p.plan_since_step, p.node) for p in info.pipelines}


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    wait_until(condition, timeout_s, what, poll_s=0.1)


def test_a_straggler_on_one_node_slows_the_other_node_down_and_a_dead_node_vanishes(
    nodes: tuple[DaemonProcess, DaemonProcess],
) -> None:
    node_a, node_b = nodes
    pipelines = [Pipeline(0, node_a), Pipeline(1, node_a), Pipeline(2, node_b), Pipeline(3, node_b)]
    _running(pipelines)
    training = _training(pipelines)
    try:
        _until(lambda: len(_by_pipeline(_job(node_b))) == 4, "node B sees node A's pipelines through etcd")
        fastest = _by_pipeline(_job(node_b))[2][0]
        assert _by_pipeline(_job(node_b))[0][2] == "node-a"

        pipelines[0].slowness = 1.3
        _until(lambda: (_job(node_a) or _fail()).straggler is not None, "node A detects pipeline 0")
        detected = (_job(node_a) or _fail()).straggler
        assert detected is not None
        assert (detected.pipeline, detected.source) == (0, "detected")
        assert detected.factor == pytest.approx(1.3, rel=0.1)

        def moved() -> bool:
            plans = _by_pipeline(_job(node_b))
            return plans[2][0] != fastest and plans[3][0] != fastest

        _until(moved, "node B's pipelines move to a slower point")
        info_b = _job(node_b)
        assert info_b is not None
        assert info_b.straggler is not None
        assert (info_b.straggler.pipeline, info_b.straggler.source) == (0, "cluster")
        for pipeline in (2, 3):
            since = _by_pipeline(info_b)[pipeline][1]
            assert since is not None
            assert since - detected.since_step <= _steps_within(PROMPT_S, pipelines[pipeline])
        assert info_b.target_time_s is not None
        assert all(
            p.plan_time_s is not None and p.plan_time_s <= info_b.target_time_s + 1e-9
            for p in info_b.pipelines
            if p.node == ""
        )
        assert info_b.cluster == "fresh"

        node_a.kill()  # SIGKILL: its lease expires, its straggler announcement with it
        _until(lambda: _by_pipeline(_job(node_b)).keys() == {2, 3}, "node A vanishes", TTL_S + 10)
        _until(lambda: (_job(node_b) or _fail()).straggler is None, "node B forgets the straggler")
        _until(lambda: {v[0] for v in _by_pipeline(_job(node_b)).values()} == {fastest}, "fastest again")
    finally:
        for pipeline in pipelines[:2]:
            pipeline.client = None  # their daemon is gone (or going): nothing to close cleanly
        training.stop()


def test_losing_etcd_falls_back_to_the_no_slowdown_plan(
    nodes: tuple[DaemonProcess, DaemonProcess], etcd: EtcdCluster
) -> None:
    node_a, node_b = nodes
    pipelines = [Pipeline(0, node_a), Pipeline(1, node_b)]
    _running(pipelines)
    training = _training(pipelines)
    try:
        with PerseusClient(node_a.dirs.runtime_dir, JOB) as client:
            reply = client.announce_straggler(0, 1.25)  # an operator's announcement, shared through etcd
        assert reply.shared
        _until(lambda: (_job(node_b) or _fail()).straggler is not None, "node B hears of the announcement")
        fastest = (_job(node_b) or _fail()).fastest_time_s
        _until(lambda: (_job(node_b) or _fail()).pipelines[-1].plan_time_s != fastest, "node B slows down")

        etcd.kill_quorum()
        _until(lambda: (_job(node_b) or _fail()).cluster == "expired", "node B's view expires", TTL_S + 10)
        info = _job(node_b)
        assert info is not None
        assert info.straggler is None
        _until(lambda: (_job(node_b) or _fail()).pipelines[-1].plan_time_s == fastest, "no-slowdown plan")
        started_s = time.monotonic()
        with PerseusClient(node_b.dirs.runtime_dir, JOB) as client:  # still serving locally, never hung
            assert client.announce_straggler(1, 1.1).shared  # kept for etcd's return
            assert [j.state for j in client.jobs().jobs if j.job == JOB] == ["running"]
        assert time.monotonic() - started_s < 10
    finally:
        training.stop()

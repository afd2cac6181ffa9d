"""A job whose pipeline spans two real daemons (node-a runs stage 0, node-b stage 1) on a real 3-member etcd:
one solve by the elected node, the same plan on both, the whole job from either node; the solving node
SIGKILLed (the other takes over within the lease TTL, keeps its plan, no new solve) and back (its stage
rejoins the plan without a new profile); etcd lost (plans keep running, the status says re-plans wait); and
two runs of the same job name that never mix.

Each stage is a thread of this process with its own client; the stages meet at a barrier after every step
and "compute" by sleeping. The profile is imported on both nodes, so the job skips online profiling (what
that measures is bench_spanning.py's business) but is still merged, solved once and shared through etcd.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.protocol import JobInfo

from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.schedule_orders import one_f_one_b_order
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.lockstep import Lockstep, cluster_env
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, sim_control
from tests.support.polling import wait_until
from tests.support.synthetic import synthetic_profile

pytestmark = [requires_etcd, pytest.mark.timeout(300)]

JOB = "span-job"
STAGES, MICROBATCHES = 2, 4
TTL_S = 3
CONTROL_TIMEOUT_S = 15.0
CLOCKS_MHZ = tuple(range(1410, 850, -45))
PROFILE_CSV = profile_to_csv(synthetic_profile(STAGES, seed=11, clocks_mhz=CLOCKS_MHZ, base_time_s=0.01))
NODES = ("node-a", "node-b")


@pytest.fixture
def nodes(etcd: EtcdCluster) -> Iterator[dict[str, DaemonProcess]]:
    etcd.restart()
    started = {
        name: DaemonProcess(DaemonDirs.create(), gpus=2, env=cluster_env(etcd, name, TTL_S)) for name in NODES
    }
    try:
        for daemon in started.values():
            daemon.start()
        yield started
    finally:
        for daemon in started.values():
            daemon.stop()


@dataclass
class Stage:
    """One stage (a process of the job on its node) driven by a thread."""

    stage: int
    daemon: DaemonProcess
    job: str = JOB
    run: str = ""
    client: PerseusClient | None = None
    gpu: str = ""
    errors: list[BaseException] = field(default_factory=list)

    def join(self) -> None:
        client = PerseusClient(self.daemon.dirs.runtime_dir, self.job, timeout_s=CONTROL_TIMEOUT_S)
        free = [g.uuid for g in client.status().gpus if g.lease is None]
        (self.gpu,) = client.claim(free[:1])
        client.profile_import(PROFILE_CSV, source="synthetic.csv", p_block_w=80.0)
        client.register(
            self.gpu, stage=self.stage, num_stages=STAGES, num_microbatches=MICROBATCHES, run=self.run
        )
        self.client = client


def _stage_step(stage: Stage, step: int) -> None:
    """One training step of `stage`: its 1F1B computations, each "computing" for 5 ms."""
    client = stage.client
    assert client is not None
    with client.step(stage.gpu, step):
        for instruction, microbatch, chunk in one_f_one_b_order(STAGES, MICROBATCHES, stage.stage):
            with client.computation(stage.gpu, stage.stage, instruction.value, microbatch, chunk):
                time.sleep(0.005)


@contextmanager
def _training(nodes: dict[str, DaemonProcess]) -> Iterator[list[Stage]]:
    """The job running on both nodes (`_running`), its stages training in lockstep until the block ends; then
    they stop and release their GPUs."""
    stages = _running(nodes)
    training = Lockstep(stages, _stage_step).start()
    try:
        yield stages
    finally:
        training.stop(release=True)


def _job(daemon: DaemonProcess, name: str = JOB) -> JobInfo | None:
    try:
        with PerseusClient(daemon.dirs.runtime_dir, "observer", timeout_s=CONTROL_TIMEOUT_S) as client:
            return next((j for j in client.jobs().jobs if j.job == name), None)
    except PerseusClientError:
        return None  # a daemon that is down or restarting


def _error(daemon: DaemonProcess) -> str:
    info = _job(daemon)
    return "" if info is None else info.error


def _state(daemon: DaemonProcess) -> str | None:
    info = _job(daemon)
    return None if info is None else info.state


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> float:
    return wait_until(condition, timeout_s, what, poll_s=0.1)


def _span(daemon: DaemonProcess) -> JobInfo:
    info = _job(daemon)
    assert info is not None
    assert info.span is not None
    return info


def _view(daemon: DaemonProcess) -> str:
    span = _span(daemon).span
    return "" if span is None else span.view


def _leader(daemon: DaemonProcess) -> str:
    span = _span(daemon).span
    return "" if span is None else span.leader


def _running(nodes: dict[str, DaemonProcess]) -> list[Stage]:
    stages = [Stage(0, nodes["node-a"]), Stage(1, nodes["node-b"])]
    for stage in stages:
        stage.join()
    for daemon in nodes.values():
        _until(lambda d=daemon: _state(d) == "running", "the job runs on both nodes")  # type: ignore[misc]
    return stages


@dataclass(frozen=True)
class Roles:
    """Who does what for the running job: the node leading it (it solved) and the other node, by name and
    daemon, and the job as node-a saw it then."""

    before: JobInfo
    leader_name: str
    other_name: str
    leader: DaemonProcess
    other: DaemonProcess


@contextmanager
def _roles(nodes: dict[str, DaemonProcess]) -> Iterator[Roles]:
    """The job training on both nodes (`_training`) and who leads it; once the block ends, every GPU of both
    nodes is back as it was (`_all_unlocked`)."""
    with _training(nodes):
        info = _span(nodes["node-a"])
        assert info.span is not None
        leader = info.span.leader
        other = next(n for n in NODES if n != leader)
        yield Roles(info, leader, other, nodes[leader], nodes[other])
    _all_unlocked(nodes)


def test_one_job_over_two_nodes_one_solve_the_same_plan_and_the_whole_job_from_either(
    nodes: dict[str, DaemonProcess],
) -> None:
    with _training(nodes) as stages:
        infos = {name: _span(daemon) for name, daemon in nodes.items()}
        plans = {info.plan_index for info in infos.values()}
        assert len(plans) == 1
        assert None not in plans
        for name, info in infos.items():
            span = info.span
            assert span is not None
            assert span.node == name
            assert span.solves == 1  # one solve for the job, not one per node
            assert span.leader in NODES
            assert {(m.node, m.stages) for m in span.members} == {("node-a", "p0:s0"), ("node-b", "p0:s1")}
            (pipeline,) = info.pipelines
            assert (pipeline.stages_registered, pipeline.node) == (2, "node-a,node-b")
            assert span.view == "fresh"
            assert span.missing == ""
        assert len({info.span.leader for info in infos.values() if info.span is not None}) == 1
        # Each node runs its own stage's part of the plan: its GPU's clock is locked by it.
        for stage in stages:
            assert sim_control(stage.daemon.dirs.runtime_dir, stage.gpu).locked_sm_clock_mhz is not None
    _all_unlocked(nodes)  # the job ended on both nodes: every GPU back as it was


def test_the_solving_node_dies_another_takes_over_and_its_stage_rejoins_without_a_new_profile(
    nodes: dict[str, DaemonProcess],
) -> None:
    with _roles(nodes) as roles:
        plan_index = roles.before.plan_index

        roles.leader.kill()  # SIGKILL: its lease (and with it the leader key) expires within the TTL
        took_s = _until(
            lambda: _leader(roles.other) == roles.other_name, "the other node takes the job over", TTL_S + 10
        )
        assert took_s <= TTL_S + 2.0  # the lease's TTL, etcd's expiry check and one round
        after = _span(roles.other)
        assert after.state == "running"
        assert after.plan_index == plan_index  # its part of the plan keeps running, unchanged
        assert after.span is not None
        assert after.span.solves == 1

        _rejoins(roles.leader, plan_index, roles.other_name)


def test_a_node_that_does_not_lead_dies_the_other_keeps_its_plan_and_the_node_rejoins(
    nodes: dict[str, DaemonProcess],
) -> None:
    with _roles(nodes) as roles:
        leader, follower = roles.leader, roles.other
        epoch = _span(leader).span.plan_epoch  # type: ignore[union-attr]

        follower.kill()
        _until(lambda: len(_span(leader).span.members) == 1, "its record vanishes", TTL_S + 10)  # type: ignore[union-attr]
        info = _span(leader)
        assert info.state == "running"
        assert info.plan_index == roles.before.plan_index  # the other stages' plans are unchanged
        assert info.span is not None
        assert (info.span.plan_epoch, info.span.solves, info.span.leader) == (epoch, 1, roles.leader_name)
        assert "pipeline 0: stages" in info.span.missing  # what it cannot see now

        _rejoins(follower, roles.before.plan_index, roles.leader_name)


def _rejoins(node: DaemonProcess, plan_index: int | None, leader_name: str) -> None:
    """The killed `node` comes back (systemd restarts the unit): its stage re-registers and runs its part of
    plan `plan_index` again, without a new profile or a new solve, `leader_name` still leading."""
    node.start()
    _until(lambda: _state(node) == "running", "the restarted node runs the plan again", 60)
    back = _span(node)
    assert back.plan_index == plan_index
    assert back.profiling is None  # rejoined without profiling again
    assert back.span is not None
    assert (back.span.solves, back.span.leader) == (1, leader_name)


def _all_unlocked(nodes: dict[str, DaemonProcess]) -> None:
    """Once the job's processes let go, no GPU is left locked on any node."""
    for daemon in nodes.values():
        _until(lambda d=daemon: _state(d) in (None, "ended"), "the job ends")  # type: ignore[misc]
        for gpu in daemon.status()["gpus"]:
            assert sim_control(daemon.dirs.runtime_dir, gpu["uuid"]).locked_sm_clock_mhz is None


def test_etcd_lost_plans_keep_running_and_the_status_says_re_plans_wait(
    nodes: dict[str, DaemonProcess], etcd: EtcdCluster
) -> None:
    with _training(nodes):
        plan_index = _span(nodes["node-b"]).plan_index
        etcd.kill_quorum()
        _until(lambda: _view(nodes["node-b"]) == "expired", "the view expires", TTL_S + 10)
        for daemon in nodes.values():
            info = _span(daemon)
            assert info.state == "running"
            assert info.plan_index == plan_index
            assert info.span is not None
            assert "re-plans wait for etcd" in info.span.missing
        etcd.restart()
        _until(lambda: _view(nodes["node-b"]) == "fresh", "etcd is back", 30)
        assert _span(nodes["node-a"]).plan_index == plan_index


def test_two_runs_of_one_job_name_on_two_nodes_never_mix(nodes: dict[str, DaemonProcess]) -> None:
    """Stage 0 of run r1 on node-a and stage 1 of run r2 on node-b: two jobs of one name, each waiting for
    its own missing stage, never one job."""
    stages = [Stage(0, nodes["node-a"], run="r1"), Stage(1, nodes["node-b"], run="r2")]
    for stage in stages:
        stage.join()
    try:
        for daemon in nodes.values():
            _until(lambda d=daemon: "waiting for" in _error(d), "the job waits", 20)  # type: ignore[misc]
        time.sleep(2 * TTL_S)  # long enough for etcd to have shown each the other, had they shared a key
        for name, daemon in nodes.items():
            info = _job(daemon)
            assert info is not None
            assert info.state == "registered"
            assert info.span is None
            missing = "stages 1" if name == "node-a" else "stages 0"
            assert f"pipeline 0: {missing} on no node seen" in info.error
    finally:
        for stage in stages:
            if stage.client is not None:
                stage.client.close()

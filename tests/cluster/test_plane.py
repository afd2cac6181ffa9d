"""The cluster plane against a real 3-member etcd cluster on loopback: sharing, dead nodes, member faults.

Two or three `ClusterPlane`s stand in for the daemons of different nodes. TTLs are 3 s so every fault plays
out in seconds; members are killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.job_board import JobView, PipelineFacts, StragglerAnnouncement, ViewState
from perseusd.cluster.plane import ClusterPlane
from tests.support.etcd_cluster import EtcdCluster, requires_etcd
from tests.support.polling import wait_until
from tests.support.ports import free_ports

pytestmark = requires_etcd

REPO_ROOT = Path(__file__).resolve().parents[2]
TTL_S = 3
EXPIRY_SLACK_S = 3.0
"""etcd looks for expired leases every 500 ms and revokes them through raft; the watcher refreshes every
0.2 s. A key outliving its lease's TTL by more than this would be a bug, not a slow machine."""

PlaneFactory = Callable[..., ClusterPlane]


def plane_config(endpoints: tuple[str, ...], node: str) -> ClusterConfig:
    return ClusterConfig(endpoints, node, lease_ttl_s=TTL_S, timeout_s=0.5, refresh_interval_s=0.2)


@pytest.fixture
def etcd(etcd: EtcdCluster) -> EtcdCluster:
    """The module's cluster (conftest) with every member running and healthy (a test before may have killed
    some)."""
    etcd.restart()
    return etcd


@pytest.fixture
def planes(etcd: EtcdCluster) -> Iterator[PlaneFactory]:
    """Start planes (one per stand-in node); every one is stopped at the end."""
    started: list[ClusterPlane] = []

    def make(node: str, endpoints: tuple[str, ...] | None = None) -> ClusterPlane:
        plane = ClusterPlane(plane_config(endpoints or etcd.endpoints, node))
        plane.start()
        started.append(plane)
        return plane

    yield make
    for plane in started:
        plane.stop()


def sees(plane: ClusterPlane, job: str, pipelines: set[int]) -> Callable[[], bool]:
    return lambda: plane.snapshot(job).fresh and set(plane.snapshot(job).pipelines) == pipelines


def test_two_nodes_share_pipelines_and_straggler_announcements(
    planes: PlaneFactory, etcd: EtcdCluster
) -> None:
    a, b = planes("node-a"), planes("node-b")
    a.publish_pipeline("share", 0, 1.0, 0.9, 1.3)
    b.publish_pipeline("share", 1, 1.2, 0.95, 1.4)
    for plane in (a, b):
        wait_until(sees(plane, "share", {0, 1}), 10, "both pipelines in each view")
    view = a.snapshot("share")
    assert view.pipelines == {
        0: PipelineFacts("node-a", 1.0, 0.9, 1.3),
        1: PipelineFacts("node-b", 1.2, 0.95, 1.4),
    }
    assert view.stragglers == {}

    b.announce_straggler("share", 1, 1.2)
    wait_until(
        lambda: a.snapshot("share").stragglers == {1: StragglerAnnouncement("node-b", 1.2)}, 10, "announce"
    )
    b.clear_straggler("share", 1)
    wait_until(lambda: not a.snapshot("share").stragglers, 10, "the announcement to be cleared")
    a.withdraw_pipeline("share", 0)
    wait_until(sees(b, "share", {1}), 10, "pipeline 0 withdrawn")

    etcd.put_raw("/perseus/v1/jobs/share/pipelines/5", b'{"version": 99}')
    wait_until(lambda: a.status().skipped_values > 0, 10, "the malformed value to be skipped")
    assert set(a.snapshot("share").pipelines) == {1}
    assert a.status().errors == 0


def test_an_unreachable_endpoint_is_rotated_past(planes: PlaneFactory, etcd: EtcdCluster) -> None:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    plane = planes("node-r", (dead, *etcd.endpoints))
    plane.publish_pipeline("rotate", 2, 1.0, 1.0, 1.0)
    wait_until(sees(plane, "rotate", {2}), 10, "the plane to work past a dead endpoint")
    status = plane.status()
    assert status.endpoint != dead
    assert status.rotations >= 1
    assert status.lease_grants == 1


def test_stop_revokes_the_lease_so_keys_vanish_at_once(planes: PlaneFactory, etcd: EtcdCluster) -> None:
    leaving, staying = planes("node-l"), planes("node-s")
    leaving.publish_pipeline("leave", 3, 1.0, 1.0, 1.1)
    wait_until(sees(staying, "leave", {3}), 10, "the leaving node's pipeline")
    lease_id = leaving.status().lease_id
    assert lease_id is not None
    leaving.stop()
    assert etcd.lease_ttl_s(lease_id) == -1
    wait_until(sees(staying, "leave", set()), 10, "the pipeline to vanish")


def start_doomed_node(endpoints: tuple[str, ...], job: str, pipeline: int) -> subprocess.Popen[bytes]:
    """A separate process holding a plane that publishes one pipeline, until it is killed."""
    script = (
        "import sys, threading\n"
        "from perseusd.cluster.plane import ClusterPlane\n"
        "from tests.cluster.test_plane import plane_config\n"
        "plane = ClusterPlane(plane_config(tuple(sys.argv[1].split(',')), 'doomed'))\n"
        "plane.start()\n"
        "plane.publish_pipeline(sys.argv[2], int(sys.argv[3]), 1.0, 0.9, 1.2)\n"
        "threading.Event().wait()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-c", script, ",".join(endpoints), job, str(pipeline)]
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=env)


def test_a_dead_node_vanishes_within_the_ttl(planes: PlaneFactory, etcd: EtcdCluster) -> None:
    watcher, silent = planes("node-w"), planes("node-q")
    doomed = start_doomed_node(etcd.endpoints, "dead", 9)
    try:
        silent.publish_pipeline("dead", 8, 1.0, 0.9, 1.2)
        wait_until(sees(watcher, "dead", {8, 9}), 20, "both other nodes' pipelines")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        silent.stop(revoke=False)  # its thread stops keeping the lease alive, as in a hang
        elapsed_s = wait_until(sees(watcher, "dead", set()), TTL_S + EXPIRY_SLACK_S, "both leases to expire")
    finally:
        doomed.kill()
        doomed.wait(timeout=10)
    assert elapsed_s > 0.5  # they lived on until their leases expired, nobody revoked them


def sample_until(
    plane: ClusterPlane, job: str, done: Callable[[JobView], bool], timeout_s: float
) -> list[JobView]:
    """Every view of `job` seen (each 50 ms) until `done` holds for one."""
    views: list[JobView] = []

    def record() -> bool:
        views.append(plane.snapshot(job))
        return done(views[-1])

    wait_until(record, timeout_s, f"a view of {job} to satisfy the condition")
    return views


def test_killing_the_leader_changes_nothing_visible(planes: PlaneFactory, etcd: EtcdCluster) -> None:
    a, b = planes("node-a"), planes("node-b")
    a.publish_pipeline("leader", 0, 1.0, 0.9, 1.3)
    b.publish_pipeline("leader", 1, 1.2, 0.9, 1.3)
    wait_until(sees(a, "leader", {0, 1}), 10, "both pipelines")
    killed = etcd.kill_leader()
    b.publish_pipeline("leader", 1, 1.25, 0.9, 1.3)
    views = sample_until(a, "leader", lambda v: v.fresh and v.pipelines[1].iteration_time_s == 1.25, 15)
    assert all(v.usable and set(v.pipelines) == {0, 1} for v in views), "a view expired or lost a pipeline"
    assert (a.status().lease_grants, b.status().lease_grants) == (1, 1)  # the leases survived the election
    assert not killed.running


def test_quorum_loss_goes_stale_then_expired_and_recovers(planes: PlaneFactory, etcd: EtcdCluster) -> None:
    a, b = planes("node-a"), planes("node-b")
    a.publish_pipeline("quorum", 0, 1.0, 0.9, 1.3)
    b.publish_pipeline("quorum", 1, 1.2, 0.9, 1.3)
    wait_until(sees(a, "quorum", {0, 1}), 10, "both pipelines")
    etcd.kill_quorum()
    views = sample_until(a, "quorum", lambda v: v.state is ViewState.EXPIRED, TTL_S + 10)
    states = [v.state for v in views]
    assert ViewState.STALE in states
    order = [ViewState.FRESH, ViewState.STALE, ViewState.EXPIRED]
    assert [order.index(s) for s in states] == sorted(order.index(s) for s in states)  # never back
    assert all(set(v.pipelines) == {0, 1} for v in views), "the last view must be served throughout"
    assert a.status().state is ViewState.EXPIRED

    etcd.restart()
    b.publish_pipeline("quorum", 1, 1.3, 0.9, 1.4)
    wait_until(
        lambda: sees(a, "quorum", {0, 1})() and a.snapshot("quorum").pipelines[1].iteration_time_s == 1.3,
        20,
        "recovery",
    )
    assert (a.status().lease_grants, b.status().lease_grants) == (2, 2)  # new leases, everything re-published
    # A round can still time out on a member catching up (revoking the old lease): wait for a clean one.
    wait_until(lambda: a.status().state is ViewState.FRESH, 20, "a fully successful round")


def test_a_second_daemon_with_the_same_node_name_publishes_nothing(planes: PlaneFactory) -> None:
    """Two planes configured with one node name would overwrite each other's records: the second publishes
    nothing and says why, and takes the name over once the first is gone."""
    first = planes("node-twin")
    first.publish_pipeline("twins", 0, 1.0, 0.9, 1.3)
    wait_until(sees(first, "twins", {0}), 10, "the first plane's pipeline")
    second = planes("node-twin")
    second.publish_pipeline("twins", 1, 1.2, 0.95, 1.4)
    wait_until(lambda: "node name node-twin is held" in (second.status().last_error or ""), 10, "the refusal")
    assert set(first.snapshot("twins").pipelines) == {0}  # nothing of the second's reached etcd
    first.stop()
    wait_until(lambda: second.status().last_error is None, 10, "the second plane to claim the name")
    wait_until(lambda: set(second.snapshot("twins").pipelines) == {1}, 10, "the second plane's pipeline")

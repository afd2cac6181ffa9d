"""The cluster plane's pure parts, without etcd: configuration, keys, values, view states, failover limits."""

from __future__ import annotations

import json
import math

import pytest

from perseusd.cluster import start_plane
from perseusd.cluster.config import ClusterConfig, parse_endpoint
from perseusd.cluster.etcd_store import ClusterError, EtcdStore
from perseusd.cluster.job_board import (
    PipelineFacts,
    StragglerAnnouncement,
    ViewState,
    build_view,
    encode_announcement,
    encode_facts,
    pipeline_key,
    straggler_key,
    view_state,
)
from perseusd.errors import ConfigError
from tests.support.polling import wait_until
from tests.support.ports import free_ports

PREFIX = "/perseus/v1"


def test_config_validates_and_derives_intervals() -> None:
    config = ClusterConfig(("127.0.0.1:2379", "https://[::1]:2379"), "node-1", lease_ttl_s=6)
    assert [e.url for e in config.parsed_endpoints] == ["http://127.0.0.1:2379", "https://[::1]:2379"]
    assert (config.keepalive_interval_s, config.stale_after_s) == (2.0, 3.0)
    bad = [
        {"endpoints": ()},
        {"endpoints": ("ftp://h:1",)},
        {"endpoints": ("h",)},
        {"node_name": "a/b"},
        {"lease_ttl_s": 1},
        {"timeout_s": 0},
        {"refresh_interval_s": 5.0},
        {"prefix": "perseus/"},
    ]
    for change in bad:
        fields = {"endpoints": ("h:1",), "node_name": "n", **change}
        with pytest.raises(ConfigError, match="invalid configuration"):
            ClusterConfig(**fields)  # type: ignore[arg-type]
    assert parse_endpoint("http://etcd-0.local:2379/").port == 2379


def test_keys_are_one_component_per_name() -> None:
    assert pipeline_key(PREFIX, "gpt3", 7) == "/perseus/v1/jobs/gpt3/pipelines/7"
    assert straggler_key(PREFIX, "gpt3", 0) == "/perseus/v1/jobs/gpt3/stragglers/0"
    for job, pipeline in (("a/b", 0), ("", 0), ("..x", 0), ("job", -1), ("job", True)):
        with pytest.raises(ValueError, match="must"):
            pipeline_key(PREFIX, job, pipeline)  # type: ignore[arg-type]


def test_values_round_trip_and_bad_ones_are_skipped() -> None:
    facts = PipelineFacts("n1", 1.25, 1.0, 1.5)
    slowed = PipelineFacts("n1", 1.32, 1.0, 1.5, plan_time_s=1.2)
    announcement = StragglerAnnouncement("n2", 1.2)
    job_prefix = "/perseus/v1/jobs/j/"
    entries = [
        (job_prefix + "pipelines/3", encode_facts(facts).encode()),
        (job_prefix + "pipelines/10", encode_facts(slowed).encode()),
        (job_prefix + "stragglers/3", encode_announcement(announcement).encode()),
        (job_prefix + "pipelines/4", b"{not json"),
        (job_prefix + "pipelines/5", json.dumps({"version": 2, "node": "n"}).encode()),
        (job_prefix + "pipelines/6", json.dumps({"version": 1, "node": "n", "iteration_time_s": 1}).encode()),
        (job_prefix + "pipelines/x", encode_facts(facts).encode()),
        (job_prefix + "stragglers/8", json.dumps({"version": 1, "node": "n", "factor": 0.5}).encode()),
        (job_prefix + "other/1", encode_facts(facts).encode()),
        (job_prefix + "pipelines/9", b"\xff"),
    ]
    pipelines, stragglers, skipped = build_view("j", PREFIX, entries)
    assert pipelines == {3: facts, 10: slowed}
    assert (facts.slowness, slowed.slowness) == (1.25, pytest.approx(1.1))
    assert stragglers == {3: announcement}
    assert skipped == len(entries) - 3


def test_facts_and_announcements_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="t_min_s <= t_max_s"):
        PipelineFacts("n", 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        PipelineFacts("n", math.nan, 1.0, 2.0)
    with pytest.raises(ValueError, match=">= 1"):
        StragglerAnnouncement("n", 0.9)


@pytest.mark.parametrize(
    ("now_s", "refreshed_at_s", "kept_alive_at_s", "expected"),
    [
        (10.0, 9.5, 9.5, ViewState.FRESH),
        (10.0, 8.0, 9.5, ViewState.STALE),  # not refreshed for 2 s > 1.5 s
        (10.0, None, 9.5, ViewState.STALE),  # never read yet, lease alive
        (10.0, 9.9, 7.0, ViewState.EXPIRED),  # no keep-alive for a whole TTL wins
        (10.0, 9.9, None, ViewState.EXPIRED),  # no lease yet
    ],
)
def test_view_state(
    now_s: float, refreshed_at_s: float | None, kept_alive_at_s: float | None, expected: ViewState
) -> None:
    assert view_state(now_s, refreshed_at_s, kept_alive_at_s, stale_after_s=1.5, ttl_s=3.0) is expected


def test_store_gives_up_after_bounded_attempts_with_backoff() -> None:
    config = ClusterConfig(tuple(f"127.0.0.1:{p}" for p in free_ports(2)), "n", lease_ttl_s=3)
    pauses_s: list[float] = []
    store = EtcdStore(config.parsed_endpoints, timeout_s=0.5, attempts=6, sleep=pauses_s.append)
    try:
        with pytest.raises(ClusterError, match=r"failed on every endpoint .* after 6 attempts"):
            store.get_prefix("/perseus/v1/jobs/j/")
    finally:
        store.close()
    assert store.rotations == 6
    assert pauses_s == [0.05, 0.1]  # after each full round of endpoints but the last


def test_a_plane_without_etcd_serves_an_expired_empty_view() -> None:
    config = ClusterConfig(
        tuple(f"127.0.0.1:{p}" for p in free_ports(3)),
        "alone",
        lease_ttl_s=3,
        timeout_s=0.5,
        refresh_interval_s=0.2,
    )
    plane = start_plane(config)
    try:
        plane.publish_pipeline("j", 0, 1.0, 0.9, 1.1)  # recorded, never waits for etcd
        wait_until(lambda: plane.status().errors >= 1, 10, "the first failed round")
        view = plane.snapshot("j")
        status = plane.status()
    finally:
        plane.stop()
    assert (view.state, view.usable, dict(view.pipelines)) == (ViewState.EXPIRED, False, {})
    assert status.lease_id is None
    assert status.last_error is not None
    assert "failed on every endpoint" in status.last_error

"""Signal sources: a replayed trace against a clock, and the Electricity Maps API v3 served from a real HTTP
server on loopback with the shared fixture JSON (nothing reaches the internet)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.carbon.sources import ElectricityMaps, ElectricityMapsSettings, TraceReplay, read_token
from perseusd.carbon.traces import SignalError, SignalPoint, load_trace
from tests.support.fake_emaps import TOKEN, FakeApi, fake_api


@pytest.fixture
def api(reference_data: Path) -> Iterator[str]:
    with fake_api(reference_data / "carbon" / "electricitymaps_history_1.json") as url:
        yield url


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def test_electricity_maps_history_and_latest_over_http(api: str, token_file: Path) -> None:
    source = ElectricityMaps(ElectricityMapsSettings("US-MIDW-MISO", token_file, api, timeout_s=5.0))
    points = source.fetch()
    assert len(points) == 25  # 24 hours of history, then the latest hour
    assert points[0].value == 501
    assert points[-1].value == 321
    assert {(path, zone, token) for path, zone, token in FakeApi.seen} == {
        ("/v3/carbon-intensity/history", "US-MIDW-MISO", TOKEN),
        ("/v3/carbon-intensity/latest", "US-MIDW-MISO", TOKEN),
    }


def test_a_failing_api_raises_a_signal_error_naming_the_status(api: str, token_file: Path) -> None:
    FakeApi.status = 503
    source = ElectricityMaps(ElectricityMapsSettings("US-MIDW-MISO", token_file, api, timeout_s=5.0))
    with pytest.raises(SignalError, match="HTTP 503"):
        source.fetch()


def test_a_wrong_token_and_an_unreachable_api_are_signal_errors(api: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    wrong.chmod(0o600)
    with pytest.raises(SignalError, match="HTTP 401"):
        ElectricityMaps(ElectricityMapsSettings("Z", wrong, api, timeout_s=5.0)).fetch()
    closed = ElectricityMapsSettings("Z", wrong, "http://127.0.0.1:9/v3", timeout_s=2.0)
    with pytest.raises(SignalError, match="electricitymaps history"):
        ElectricityMaps(closed).fetch()


def test_a_token_file_others_can_read_is_refused(token_file: Path) -> None:
    token_file.chmod(0o644)
    with pytest.raises(SignalError, match="chmod 600"):
        read_token(token_file)
    token_file.chmod(0o600)
    assert read_token(token_file) == TOKEN
    if os.geteuid() == 0:
        os.chown(token_file, 12345, -1)
        with pytest.raises(SignalError, match="another user"):
            read_token(token_file)


def test_a_token_file_symlink_or_fifo_is_refused(token_file: Path) -> None:
    """A link to a file the daemon owns (or to another user's secret) is never followed; a FIFO never
    blocks the read."""
    link = token_file.with_name("link")
    link.symlink_to(token_file)
    with pytest.raises(SignalError, match="is a symlink"):
        read_token(link)
    fifo = token_file.with_name("fifo")
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SignalError, match="not a regular file"):
        read_token(fifo)


def test_a_trace_replays_against_the_clock_and_loops(reference_data: Path) -> None:
    trace = load_trace(reference_data / "carbon" / "chase_carbon_hist.csv")
    now = [1000.0]
    replay = TraceReplay(trace, speed=1800.0, started_s=1000.0, clock_s=lambda: now[0])
    assert replay.fetch() == [trace[0]]
    now[0] += 10.0  # 10 s at x1800 = 5 h = 10 intervals
    fetched = replay.fetch()
    assert fetched[-1] == trace[10]
    assert fetched[0] == trace[0]
    now[0] += 157.0  # past the end (167 intervals): the replay starts over
    assert replay.fetch()[-1] == trace[0]


def test_a_replay_needs_points_and_a_positive_speed() -> None:
    with pytest.raises(SignalError):
        TraceReplay([])
    with pytest.raises(SignalError, match="speed"):
        TraceReplay([SignalPoint(0.0, 1.0)], speed=0.0)

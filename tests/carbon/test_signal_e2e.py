"""The real daemon with the Electricity Maps source pointed at a fake API on loopback: status shows the
signal, a failing API leaves the last value for its bounded age, then the daemon says carbon-aware jobs run
their default point (status and log); a trace file that cannot be read stops the daemon at start with a
clear error."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ctl import run_ctl
from tests.support.fake_emaps import TOKEN, FakeApi, fake_api
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def api(reference_data: Path) -> Iterator[str]:
    with fake_api(reference_data / "carbon" / "electricitymaps_history_2.json") as url:
        yield url


def _signal(daemon: DaemonProcess) -> dict[str, Any]:
    signal = daemon.status()["signal"]
    assert isinstance(signal, dict)
    return signal


def _wait_state(daemon: DaemonProcess, state: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline_s = time.monotonic() + timeout_s
    while True:
        signal = _signal(daemon)
        if signal["state"] == state:
            return signal
        assert time.monotonic() < deadline_s, f"the signal never became {state}: {signal}"
        time.sleep(0.2)


def test_status_shows_the_signal_then_its_failure(api: str) -> None:
    dirs = DaemonDirs.create()
    token = dirs.base / "emaps.token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    env = {
        "PERSEUSD_SIGNAL_SOURCE": "electricitymaps",
        "PERSEUSD_SIGNAL_ZONE": "US-MIDW-MISO",
        "PERSEUSD_SIGNAL_API_URL": api,
        "PERSEUSD_SIGNAL_TOKEN_FILE": str(token),
        "PERSEUSD_SIGNAL_POLL_S": "0.5",
        "PERSEUSD_SIGNAL_MAX_AGE_S": "10",  # a stale window a loaded machine cannot poll past
        "PERSEUSD_CARBON_FORECASTER": "persistence",
    }
    daemon = DaemonProcess(dirs, env=env).start()
    try:
        signal = _wait_state(daemon, "ok")
        assert signal["value"] == 321.0  # the latest reply
        assert signal["forecast"] == 321.0
        assert signal["unit"] == "gCO2eq/kWh"
        assert signal["source"] == "electricitymaps zone US-MIDW-MISO"
        table = run_ctl(dirs.runtime_dir, "status", check=True)
        assert "grid signal: electricitymaps zone US-MIDW-MISO, ok: 321.0 gCO2eq/kWh" in table.stdout

        FakeApi.status = 503
        stale = _wait_state(daemon, "stale")
        assert stale["value"] == 321.0
        assert "HTTP 503" in stale["error"]
        expired = _wait_state(daemon, "expired")
        assert expired["value"] is None
        assert expired["forecast"] is None
        FakeApi.status = 200
        _wait_state(daemon, "ok")
    finally:
        daemon.stop()
    log = daemon.log()
    assert "keeping the last value for up to 10 s" in log
    assert "carbon-aware jobs run their default point" in log


def test_an_unreadable_trace_stops_the_daemon_at_start(tmp_path: Path) -> None:
    dirs = DaemonDirs.create()
    env = {"PERSEUSD_SIGNAL_SOURCE": "trace", "PERSEUSD_SIGNAL_TRACE": str(tmp_path / "missing.csv")}
    daemon = DaemonProcess(dirs, env=env).start(wait=False)
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=60) != 0
    assert "cannot read the signal trace" in daemon.log()


def test_a_trace_replays_into_status(reference_data: Path) -> None:
    dirs = DaemonDirs.create()
    trace = reference_data / "carbon" / "chase_carbon_hist.csv"
    env = {"PERSEUSD_SIGNAL_SOURCE": "trace", "PERSEUSD_SIGNAL_TRACE": str(trace)}
    daemon = DaemonProcess(dirs, env=env).start()
    try:
        signal = _wait_state(daemon, "ok")
    finally:
        daemon.stop()
    assert signal["value"] == pytest.approx(646.8567445847223)  # the trace's first interval
    assert signal["source"] == "trace chase_carbon_hist.csv (167 points, x1)"
    json.dumps(signal)

"""An active driver power feature is never silent: a warning at start, a line in `perseusctl status`, a
field of the status row and a metric (the features themselves are read from NVML: tests/gpu)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from perseus_client.protocol import StatusRequest
from prometheus_client.core import Metric

from perseusd.ctl.status_cmd import render_table
from perseusd.daemon.deferred import resolved
from perseusd.daemon.main import read_power_features
from perseusd.gpu.power_features import PowerFeature
from perseusd.gpu.sim import SimBackend
from perseusd.metrics.collector import PerseusCollector
from tests.support.callers import ME
from tests.support.daemon_core import sim_core

SMOOTHING = PowerFeature("power_smoothing", "active", "primary power floor 350 W")
PROFILE = PowerFeature("workload_power_profile", "not supported")


def test_an_active_feature_is_logged_shown_and_exported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SimBackend(tmp_path / "dev", gpus=1)
    try:
        (device,) = backend.devices()
        device.power_features = lambda: (PROFILE, SMOOTHING)  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING):
            assert read_power_features(device) == (PROFILE, SMOOTHING)
        assert "power smoothing: active (primary power floor 350 W)" in caplog.text
        assert "workload power profile" not in caplog.text  # not supported: nothing to warn of
    finally:
        backend.close()
    with sim_core(tmp_path, 2) as core:
        first, second = core.registry.uuids
        core.registry.power_features = {first: (PROFILE, SMOOTHING), second: ()}
        reply = resolved(core.handle(ME, StatusRequest()))
        rows = {row.uuid: row for row in reply.gpus}  # type: ignore[attr-defined]
        assert rows[first].power_features == (
            "workload power profile: not supported",
            "power smoothing: active (primary power floor 350 W)",
        )
        assert rows[second].power_features == ()
        table = render_table(reply)  # type: ignore[arg-type]
        assert f"{first}: power smoothing: active (primary power floor 350 W)" in table
        assert "not supported" not in table
        families: dict[str, Metric] = {f.name: f for f in PerseusCollector(core).collect()}
        samples = families["perseus_gpu_driver_power_feature_active"].samples
        states = {(s.labels["UUID"], s.labels["feature"], s.labels["state"]): s.value for s in samples}
        assert states == {
            (first, "workload_power_profile", "not supported"): 0.0,
            (first, "power_smoothing", "active"): 1.0,
        }

"""Grid metrics from a daemon core (no sockets): the signal (value, forecast, age, state) and each job's
carbon (or cost, for a price signal) beside its all-max counterfactual; nothing without a signal."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from perseus_client.protocol import (
    StepBegin,
    StepEnd,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from perseusd.carbon.keeper import SignalKeeper
from perseusd.carbon.traces import SignalPoint
from perseusd.daemon.core import DaemonCore
from perseusd.jobs.carbon_steering import CarbonSettings, CarbonSteering
from perseusd.leasing.identity import Caller
from perseusd.metrics.collector import PerseusCollector
from tests.support.daemon_core import core_job, running_core

pytestmark = pytest.mark.timeout(120)

STAGES = 2
ME = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(core: DaemonCore) -> Samples:
    registry = CollectorRegistry()
    registry.register(PerseusCollector(core, job_names=True))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def now() -> list[float]:
    return [0.0]


@contextmanager
def _core(tmp_path: Path, keeper: SignalKeeper | None, now: list[float]) -> Iterator[DaemonCore]:
    steering = CarbonSteering(keeper, CarbonSettings(), clock_s=lambda: now[0])
    with running_core(tmp_path, 1, STAGES, 4, carbon=steering) as core:
        yield core


def _run_until_counted(core: DaemonCore) -> None:
    deadline_s = time.monotonic() + 30
    step = 0
    while True:
        for gpu in core.registry.uuids:
            core.on_event(ME, StepBegin(gpu, step, time.monotonic_ns()))
            core.on_event(ME, StepEnd(gpu, step, time.monotonic_ns()))
        step += 1
        core.tick()
        carbon = core_job(core).carbon
        if carbon is not None and carbon.carbon_g > 0 and carbon.all_max_carbon_g:
            return
        assert time.monotonic() < deadline_s, "no carbon was counted"
        time.sleep(0.1)


@pytest.mark.parametrize(("unit", "amount"), [("gCO2eq/kWh", "gCO2eq"), ("EUR/kWh", "EUR")])
def test_the_signal_and_each_jobs_carbon_or_cost(
    tmp_path: Path, now: list[float], unit: str, amount: str
) -> None:
    # The label is the signal's kind, not its description (which changes with the trace and its speed).
    description = "trace chase_carbon_hist (167 points, x60)"
    keeper = SignalKeeper(description, unit, 3600.0, "persistence", clock_s=lambda: now[0])
    keeper.update([SignalPoint(1800.0 * i, 500.0) for i in range(4)])
    with _core(tmp_path, keeper, now) as core:
        _run_until_counted(core)
        now[0] = 42.0
        samples = _scrape(core)
        assert _value(samples, "perseus_grid_signal_value", source="trace", unit=unit) == 500.0
        assert _value(samples, "perseus_grid_signal_forecast", source="trace", unit=unit) == 500.0
        assert _value(samples, "perseus_grid_signal_age_seconds", source="trace") == 42.0
        assert _value(samples, "perseus_grid_signal_state", source="trace", state="ok") == 1.0
        assert _value(samples, "perseus_grid_signal_state", source="trace", state="expired") == 0.0
        carbon = core_job(core).carbon
        assert carbon is not None
        key = {"job_name": "train", "uid": str(os.getuid()), "unit": amount}
        emitted = _value(samples, "perseus_job_grid_cost_total", **key)
        assert emitted is not None
        assert emitted == pytest.approx(carbon.carbon_g, rel=0.05, abs=1e-5)  # counted on between reads
        assert emitted > 0
        basis = carbon.all_max_basis  # the all-max figure says how it is known
        assert basis in ("measured", "predicted", "mixed")
        all_max = _value(samples, "perseus_job_grid_cost_all_max_total", **key, basis=basis)
        assert all_max is not None
        assert all_max > 0
        counted = _value(
            samples,
            "perseus_job_grid_energy_joules_total",
            job_name="train",
            uid=str(os.getuid()),
            signal="counted",
        )
        assert counted is not None
        assert counted > 0

        now[0] = 3700.0  # no read for longer than the bounded age: expired, no value exported
        keeper.failed("the API is down")
        samples = _scrape(core)
        assert _value(samples, "perseus_grid_signal_state", source="trace", state="expired") == 1.0
        assert _value(samples, "perseus_grid_signal_value", source="trace", unit=unit) is None


def test_no_grid_metrics_without_a_signal(tmp_path: Path, now: list[float]) -> None:
    with _core(tmp_path, None, now) as core:
        names = {name for name, _labels in _scrape(core)}
        assert "perseus_job_state" in names
        assert not [n for n in names if "grid" in n]

"""Energy windows (`perseus_client.energy`) and `perseusctl measure` against a real perseusd, simulated GPUs.

The simulated GPUs idle at a constant power and publish their energy counter every 100 ms like NVML's, so a
window's energy must match power x time within the uncertainty the library reports for that granularity.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from perseus_client import PerseusClient
from perseus_client.client import PerseusClientError
from perseus_client.energy import EnergyMonitor, Measurement
from perseus_client.energy_messages import EnergyRead, EnergyReading

from tests.support.ctl import run_ctl
from tests.support.perseusd_proc import (
    DaemonDirs,
    DaemonProcess,
    client_outcome,
    daemon_processes,
    run_as_user,
)

pytestmark = pytest.mark.timeout(120)

GPUS = 2
PERIOD_S = 0.1


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=GPUS, env={"PERSEUSD_SOCKET_GROUP": "nogroup"}).start()


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[PerseusClient]:
    with PerseusClient(daemon.dirs.runtime_dir, job="energy-test", timeout_s=10.0) as connected:
        yield connected


def _idle_power_w(client: PerseusClient) -> dict[str, float]:
    return {gpu.uuid: gpu.power_w for gpu in client.status().gpus if gpu.power_w is not None}


def test_a_window_measures_power_times_time(client: PerseusClient) -> None:
    monitor = EnergyMonitor(client)
    assert len(monitor.gpus) == GPUS
    power_w = _idle_power_w(client)
    monitor.begin_window("sleep")
    time.sleep(1.5)
    m = monitor.end_window("sleep")
    assert m.time_s >= 1.5
    assert m.counter_period_s == pytest.approx(PERIOD_S)
    for uuid in monitor.gpus:
        expected_j = power_w[uuid] * m.time_s
        assert m.uncertainty_j[uuid] == pytest.approx(PERIOD_S * power_w[uuid], rel=0.05)
        # The counter lags by up to one period at each end (plus the reads' own time on a loaded machine).
        assert abs(m.energy_j[uuid] - expected_j) <= 2 * m.uncertainty_j[uuid] + 0.05 * expected_j
    assert m.relative_uncertainty < 0.2


def test_windows_nest_and_choose_gpus(client: PerseusClient) -> None:
    second = client.daemon_info.gpus[1].uuid  # type: ignore[union-attr]
    monitor = EnergyMonitor(client, gpus=[1])
    assert monitor.gpus == (second,)
    monitor.begin_window("outer")
    time.sleep(0.3)
    monitor.begin_window("inner")
    time.sleep(0.5)
    inner = monitor.end_window("inner")
    time.sleep(0.3)
    outer = monitor.end_window("outer")
    assert set(outer.energy_j) == {second}
    assert outer.time_s > inner.time_s + 0.5
    assert outer.energy_j[second] > inner.energy_j[second] > 0


def test_windows_from_many_threads(client: PerseusClient) -> None:
    monitor = EnergyMonitor(client)
    results: dict[int, Measurement] = {}
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            monitor.begin_window(f"thread-{index}")
            time.sleep(0.3)
            results[index] = monitor.end_window(f"thread-{index}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(results) == list(range(8))
    assert all(m.time_s >= 0.3 and m.total_energy_j >= 0 for m in results.values())


def test_a_short_window_says_it_is_imprecise(client: PerseusClient) -> None:
    monitor = EnergyMonitor(client, gpus=[0])
    monitor.begin_window("blink")
    m = monitor.end_window("blink")
    if m.time_s < PERIOD_S:  # (a very loaded machine may take longer than a period for the two reads)
        assert m.relative_uncertainty >= 0.5


def test_window_misuse_is_a_clear_error(client: PerseusClient) -> None:
    monitor = EnergyMonitor(client)
    monitor.begin_window("once")
    with pytest.raises(ValueError, match="already open"):
        monitor.begin_window("once")
    with pytest.raises(ValueError, match="not open"):
        monitor.end_window("never")
    with pytest.raises(ValueError, match="out of range"):
        EnergyMonitor(client, gpus=[GPUS])
    with pytest.raises(ValueError, match="no GPU"):
        EnergyMonitor(client, gpus=["GPU-not-here"])


def test_a_gpu_named_many_times_is_refused(client: PerseusClient) -> None:
    """256 reads of one GPU per request, queued on its owner thread while the main loop waits, let two
    flooders without a lease slow every other user: a GPU named twice is refused at once."""
    gpu = client.status().gpus[0].uuid
    with pytest.raises(PerseusClientError) as refused:
        client._call(EnergyRead(gpus=(gpu,) * 256), EnergyReading)
    assert refused.value.code == "BAD_FIELD"
    assert "named more than once" in refused.value.message
    assert EnergyMonitor(client, gpus=[0, 0, gpu]).gpus == (gpu,)  # the library names each GPU once


def test_an_unprivileged_user_measures_without_a_lease(daemon: DaemonProcess) -> None:
    runtime_dir = daemon.dirs.runtime_dir

    def measure(client: PerseusClient) -> float:
        monitor = EnergyMonitor(client)
        monitor.begin_window("nobody")
        time.sleep(0.5)
        return monitor.end_window("nobody").total_energy_j

    code, energy_j = run_as_user(lambda: client_outcome(runtime_dir, measure))
    assert code == "ok", energy_j
    assert energy_j > 0


def _measure(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ctl(runtime_dir, "measure", *args, timeout_s=60)


def test_perseusctl_measure_runs_the_command(daemon: DaemonProcess) -> None:
    proc = _measure(
        daemon.dirs.runtime_dir, "--json", "--gpu", "0", "--", "sh", "-c", "sleep 1; echo out; exit 3"
    )
    assert proc.returncode == 3
    output, json_line = proc.stdout.splitlines()  # --json on stdout, its last line
    assert output == "out"
    assert proc.stderr == ""
    report = json.loads(json_line)
    assert report["exit_code"] == 3
    assert report["time_s"] >= 1.0
    [(uuid, energy_j)] = report["energy_j"].items()
    assert energy_j > 0
    assert report["uncertainty_j"][uuid] > 0
    text = _measure(daemon.dirs.runtime_dir, "--", "true")
    assert text.returncode == 0
    assert "total" in text.stderr
    assert "J ±" in text.stderr


def test_perseusctl_measure_usage_errors(daemon: DaemonProcess) -> None:
    assert _measure(daemon.dirs.runtime_dir).returncode == 2
    missing = _measure(daemon.dirs.runtime_dir, "--", "/nonexistent/command")
    assert missing.returncode == 127
    assert "cannot run" in missing.stderr
    killed = _measure(daemon.dirs.runtime_dir, "--", "sh", "-c", "kill -9 $$")
    assert killed.returncode == 128 + 9
    unknown = _measure(daemon.dirs.runtime_dir, "--gpu", "7", "--", "true")
    assert unknown.returncode == 1
    assert "no GPU" in unknown.stderr

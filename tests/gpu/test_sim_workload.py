"""A separate workload process really runs on a simulated GPU at the clock the daemon side set."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perseusd.gpu.errors import GpuInvalidArgumentError
from perseusd.gpu.sim import SimBackend
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.bundled import bundled_profile
from perseusd.workload.sim_costs import WorkloadCosts
from perseusd.workload.sim_workload import SimGpuHandle, list_sim_gpus

WORKER = Path(__file__).with_name("sim_worker.py")
A100_BLOCKING_W = 83.64


def test_workload_process_consumes_time_and_energy_at_the_daemon_clock(tmp_path: Path) -> None:
    before_s = time.monotonic()
    backend = SimBackend(tmp_path, noise=0.0, update_period_s=0.02)
    after_s = time.monotonic()
    device = backend.sim_devices()[0]
    model = WorkloadCosts(bundled_profile("a100_sxm"), load_board("a100_sxm"))
    assert list_sim_gpus(tmp_path) == sorted(d.info.uuid for d in backend.devices())
    assert device.set_locked_sm_clock_mhz(1005) == 1005
    slow = model.cost(0, "forward", 1005)
    command = [sys.executable, str(WORKER), str(tmp_path), device.info.uuid, "3"]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as worker:
        assert worker.stdout is not None
        assert worker.stdin is not None
        report = json.loads(worker.stdout.readline())
        assert [r["clock_mhz"] for r in report["records"]] == [1005, 1005, 1005]
        assert [r["duration_s"] for r in report["records"]] == [pytest.approx(slow.time_s)] * 3
        assert report["wall_s"] >= 3 * slow.time_s
        assert report["clock_write"] == "refused"
        assert device.locked_sm_clock_mhz() == 1005
        device.set_locked_sm_clock_mhz(1410)
        worker.stdin.write("go\n")
        worker.stdin.flush()
        last = json.loads(worker.stdout.readline())
        assert worker.wait(timeout=10) == 0
    fast = model.cost(0, "forward", 1410)
    assert last["clock_mhz"] == 1410
    assert last["energy_j"] == pytest.approx(fast.energy_j)
    time.sleep(0.03)
    read_before_s = time.monotonic()
    published_j = device.energy_mj() / 1000
    read_after_s = time.monotonic()
    excess_j = 3 * (slow.energy_j - A100_BLOCKING_W * slow.time_s) + (
        fast.energy_j - A100_BLOCKING_W * fast.time_s
    )
    low_j = excess_j + A100_BLOCKING_W * (read_before_s - after_s) - 0.002
    high_j = excess_j + A100_BLOCKING_W * (read_after_s - before_s) + 0.002
    assert low_j <= published_j <= high_j
    backend.close()


def test_workload_has_no_way_to_change_clocks(tmp_path: Path) -> None:
    backend = SimBackend(tmp_path, noise=0.0)
    uuid = backend.devices()[0].info.uuid
    with SimGpuHandle.open(tmp_path, uuid) as gpu:
        assert not any(name.startswith(("set_", "reset")) for name in dir(gpu))
        assert gpu.power_limit_w() == 500.0  # the board's default
        with pytest.raises(GpuInvalidArgumentError):
            gpu.run(0, "sideways")
        with pytest.raises(GpuInvalidArgumentError):
            gpu.throttle(0.0)
    backend.close()


def test_opening_a_missing_gpu_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GpuInvalidArgumentError, match="no simulated GPU"):
        SimGpuHandle.open(tmp_path, "GPU-nope")

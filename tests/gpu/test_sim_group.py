"""Simulated GPUs running one computation together (a tensor-parallel stage): each at its own clock, each
recording its own time and energy as `SimGpuHandle.run` would, the call ending with the slowest."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from perseusd.gpu.sim import SimBackend
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.bundled import bundled_profile
from perseusd.workload.sim_costs import WorkloadCosts
from perseusd.workload.sim_group import run_together
from perseusd.workload.sim_workload import SimGpuHandle


def test_gpus_run_together_at_their_own_clocks_and_a_clock_changed_mid_run_applies_to_the_work_left(
    tmp_path: Path,
) -> None:
    backend = SimBackend(tmp_path, gpus=2, noise=0.0, update_period_s=0.02)
    first, second = backend.sim_devices()
    model = WorkloadCosts(bundled_profile("a100_sxm"), load_board("a100_sxm"))
    first.set_locked_sm_clock_mhz(1410)
    second.set_locked_sm_clock_mhz(1005)
    fast, slow = model.cost(0, "forward", 1410), model.cost(0, "forward", 1005)
    with (
        SimGpuHandle.open(tmp_path, first.info.uuid) as a,
        SimGpuHandle.open(tmp_path, second.info.uuid) as b,
    ):
        started_s = time.monotonic()
        records = run_together([a, b], 0, "forward")
        wall_s = time.monotonic() - started_s
        assert [r.clock_mhz for r in records] == [1410, 1005]
        assert [r.duration_s for r in records] == [pytest.approx(fast.time_s), pytest.approx(slow.time_s)]
        assert [r.energy_j for r in records] == [pytest.approx(fast.energy_j), pytest.approx(slow.energy_j)]
        assert wall_s >= slow.time_s  # the group waits for its slowest GPU
    # The second GPU is raised to 1410 MHz half way through: the work left runs at the new clock. On a virtual
    # clock (the raise lands half way through whatever the machine's load), the handles' own sleeps drive it.
    time_now = _VirtualTime(time.monotonic(), slow.time_s / 2, lambda: second.set_locked_sm_clock_mhz(1410))
    with (
        SimGpuHandle.open(tmp_path, first.info.uuid, clock=time_now.clock, sleep=time_now.sleep) as a,
        SimGpuHandle.open(tmp_path, second.info.uuid, clock=time_now.clock, sleep=time_now.sleep) as b,
    ):
        again = run_together([a, b], 0, "forward")
        assert time_now.fired
        assert again[1].clock_switches == 1
        assert fast.time_s < again[1].duration_s < slow.time_s
        low_j, high_j = sorted((fast.energy_j, slow.energy_j))
        assert low_j < again[1].energy_j < high_j  # part of the work at each clock
    backend.close()


class _VirtualTime:
    """A clock that moves only when slept on, running `action` once when it passes `after_s` seconds."""

    def __init__(self, start_s: float, after_s: float, action: Callable[[], None]) -> None:
        self.now_s, self.at_s, self.action, self.fired = start_s, start_s + after_s, action, False

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds
        if not self.fired and self.now_s >= self.at_s:
            self.fired = True
            self.action()

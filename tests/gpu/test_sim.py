"""The simulated backend: profile-driven energy, publication period, noise, persistence, fault injection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseusd.gpu.errors import GpuInvalidArgumentError, GpuLostError, GpuPermissionError, GpuTimeoutError
from perseusd.gpu.select import open_backend
from perseusd.gpu.sim import SimBackend, SimDevice
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.bundled import bundled_profile
from perseusd.workload.sim_costs import WorkloadCosts
from perseusd.workload.sim_workload import SimGpuHandle

from .conftest import FakeClock

A100_BLOCKING_W = 83.64
A100 = WorkloadCosts(bundled_profile("a100_sxm"), load_board("a100_sxm"))
"""The GPT-3 workload on the A100 board: what the tests' workloads bring (the handle's default)."""


def test_boards_keep_the_a100_and_a40_facts() -> None:
    a100 = load_board("a100_sxm")
    assert a100.clocks_mhz == tuple(range(1410, 854, -15))
    assert (a100.power_capping, a100.idle_power_w(1005), a100.idle_power_w(None)) == (True, 83.64, 83.64)
    limits_w = (a100.power_limit_min_w, a100.power_limit_max_w, a100.power_limit_default_w)
    assert limits_w == (100.0, 500.0, 500.0)  # the 500 W A100 SXM4 80GB configuration
    cost = A100.cost(0, "forward", 1410)
    assert cost.time_s == pytest.approx(0.05016166687011708)
    assert cost.energy_j == pytest.approx(23.80547200000007)
    a40 = load_board("a40")
    assert a40.clocks_mhz[0] == 1740
    assert a40.clocks_mhz[-1] == 855
    assert a40.power_limit_max_w == 300.0
    with pytest.raises(GpuInvalidArgumentError, match="known: a100_sxm, a40, h100_sxm"):
        load_board("h100")


def test_the_a100_board_caps_only_under_a_lowered_limit() -> None:
    """The shipped GPT-3 profile draws at most about 481 W: at the default limit nothing is capped (the A100
    results of every test and benchmark are those of an uncapped board), and a lowered limit (Chase's knob,
    node power caps) runs each computation at the highest clock whose power fits, as on the H100 board."""
    a100 = load_board("a100_sxm")
    profile = bundled_profile("a100_sxm")
    keys = {(m.stage, m.instruction) for m in profile.measurements}
    peak_w = max(A100.cost(s, i, c).power_w for s, i in keys for c in a100.clocks_mhz)
    assert 470.0 < peak_w < a100.power_limit_default_w
    for stage, instruction in keys:
        for clock in a100.clocks_mhz:
            run = A100.run_cost(stage, instruction, clock, a100.power_limit_default_w)
            expected = A100.cost(stage, instruction, clock)
            assert (run.capped, run.clock_mhz, run.cost) == (False, clock, expected)
    capped = A100.run_cost(0, "backward", 1410, 300.0)
    uncapped = A100.cost(0, "backward", 1410)
    assert (capped.capped, capped.clock_mhz < 1410, capped.cost.power_w <= 300.0) == (True, True, True)
    assert capped.cost.time_s > uncapped.time_s
    assert capped.cost.energy_j < uncapped.energy_j
    above = [c for c in a100.clocks_mhz if c > capped.clock_mhz and c <= 1410]
    assert all(A100.cost(0, "backward", c).power_w > 300.0 for c in above)


def test_idle_energy_is_blocking_power_published_once_per_period(
    sim_backend: SimBackend, fake_clock: FakeClock
) -> None:
    device = sim_backend.devices()[0]
    assert device.energy_mj() == 0
    fake_clock.advance(0.05)
    assert device.energy_mj() == 0
    fake_clock.advance(0.05)
    assert device.energy_mj() == round(A100_BLOCKING_W * 0.1 * 1000)
    fake_clock.advance(0.09)
    assert device.energy_mj() == round(A100_BLOCKING_W * 0.1 * 1000)
    fake_clock.advance(0.01)
    assert device.energy_mj() == round(A100_BLOCKING_W * 0.2 * 1000)
    assert device.power_w() == pytest.approx(A100_BLOCKING_W)


def test_busy_energy_follows_the_profile_at_the_locked_clock(
    sim_backend: SimBackend, fake_clock: FakeClock
) -> None:
    device = sim_backend.sim_devices()[0]
    assert device.set_locked_sm_clock_mhz(1000) == 1005
    cost = A100.cost(3, "backward", 1005)
    seen_power_w: list[float] = []

    def sleep_and_look(duration_s: float) -> None:
        fake_clock.advance(duration_s / 2)
        seen_power_w.append(device.power_w())
        fake_clock.advance(duration_s / 2)

    with SimGpuHandle.open(
        sim_backend.sim_dir, device.info.uuid, clock=fake_clock, sleep=sleep_and_look
    ) as gpu:
        record = gpu.run(3, "backward")
    assert (record.clock_mhz, record.duration_s, record.energy_j) == (1005, cost.time_s, cost.energy_j)
    assert seen_power_w
    assert all(w == pytest.approx(cost.power_w) for w in seen_power_w)
    fake_clock.advance(1.0 - cost.time_s)
    expected_j = cost.energy_j + A100_BLOCKING_W * (1.0 - cost.time_s)
    assert device.true_energy_j() == pytest.approx(expected_j)
    assert device.energy_mj() == round(expected_j * 1000)


def test_unlocked_gpu_runs_at_its_highest_clock(sim_backend: SimBackend, fake_clock: FakeClock) -> None:
    uuid = sim_backend.devices()[1].info.uuid
    with SimGpuHandle.open(sim_backend.sim_dir, uuid, clock=fake_clock, sleep=fake_clock.sleep) as gpu:
        assert gpu.current_clock_mhz() == 1410
        record = gpu.run(0, "forward", time_scale=0.5)
        assert record.duration_s == pytest.approx(0.05016166687011708 / 2)
        assert sum(fake_clock.sleeps_s) == pytest.approx(record.duration_s)
        gpu.throttle(2.0)
        assert gpu.cost(0, "forward").time_s == pytest.approx(0.05016166687011708 * 2)


def test_a_computation_knows_the_gpus_exact_energy_as_it_began(
    sim_backend: SimBackend, fake_clock: FakeClock
) -> None:
    """`RunRecord.gpu_energy_j` is the device's exact energy at the computation's start: earlier busy
    energy, idle at one locked clock, then idle at another after a change (the trace's exact figure)."""
    device = sim_backend.sim_devices()[0]
    with SimGpuHandle.open(
        sim_backend.sim_dir, device.info.uuid, clock=fake_clock, sleep=fake_clock.sleep
    ) as gpu:
        first = gpu.run(0, "forward")
        assert first.gpu_energy_j == pytest.approx(device.true_energy_j() - first.energy_j, abs=1e-9)
        fake_clock.advance(0.3)
        device.set_locked_sm_clock_mhz(1005)
        fake_clock.advance(0.2)
        expected_j = device.true_energy_j()
        second = gpu.run(1, "backward")
    assert second.gpu_energy_j == pytest.approx(expected_j)
    assert second.gpu_energy_j > first.energy_j + (first.gpu_energy_j or 0.0)


def test_a_clock_change_mid_computation_applies_to_the_work_left(
    sim_backend: SimBackend, fake_clock: FakeClock
) -> None:
    device = sim_backend.sim_devices()[0]
    high, low = A100.cost(2, "forward", 1410), A100.cost(2, "forward", 1005)
    switch_at_s = fake_clock() + high.time_s / 4

    def sleep_and_switch(duration_s: float) -> None:
        before_s = fake_clock()
        fake_clock.advance(duration_s)
        if before_s < switch_at_s <= fake_clock():
            device.set_locked_sm_clock_mhz(1005)

    with SimGpuHandle.open(
        sim_backend.sim_dir, device.info.uuid, clock=fake_clock, sleep=sleep_and_switch
    ) as gpu:
        record = gpu.run(2, "forward")
    done_at_high = pytest.approx(0.25, abs=0.001 / high.time_s)  # the switch is seen within one 1 ms poll
    high_fraction = (record.duration_s - low.time_s) / (high.time_s - low.time_s)
    assert (record.clock_mhz, record.clock_switches) == (1410, 1)
    assert high_fraction == done_at_high
    assert record.energy_j == pytest.approx(
        high_fraction * high.energy_j + (1 - high_fraction) * low.energy_j, rel=1e-9
    )
    fake_clock.advance(1.0 - record.duration_s)
    expected_j = record.energy_j + A100_BLOCKING_W * (1.0 - record.duration_s)
    assert device.true_energy_j() == pytest.approx(expected_j)


def test_without_polling_the_clock_is_read_once(sim_backend: SimBackend, fake_clock: FakeClock) -> None:
    device = sim_backend.sim_devices()[0]
    high = A100.cost(2, "forward", 1410)

    def sleep_and_switch(duration_s: float) -> None:
        fake_clock.advance(duration_s)
        device.set_locked_sm_clock_mhz(1005)

    with SimGpuHandle.open(
        sim_backend.sim_dir, device.info.uuid, clock=fake_clock, sleep=sleep_and_switch, clock_poll_s=None
    ) as gpu:
        record = gpu.run(2, "forward")
    assert (record.clock_mhz, record.clock_switches) == (1410, 0)
    assert (record.duration_s, record.energy_j) == (pytest.approx(high.time_s), pytest.approx(high.energy_j))


def test_noise_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    readings = []
    for run in range(2):
        clock = FakeClock()
        backend = SimBackend(tmp_path / f"sim{run}", noise=0.05, seed=7, clock=clock, sleep=clock.sleep)
        device = backend.devices()[0]
        values = []
        for _ in range(5):
            clock.advance(0.1)
            values.append(device.energy_mj())
        readings.append(values)
        backend.close()
    assert readings[0] == readings[1]
    exact = [round(A100_BLOCKING_W * 0.1 * (i + 1) * 1000) for i in range(5)]
    assert readings[0] != exact
    assert readings[0][-1] == pytest.approx(exact[-1], rel=0.1)
    assert readings[0] == sorted(readings[0])


def test_state_survives_a_daemon_restart_unless_fresh(tmp_path: Path, fake_clock: FakeClock) -> None:
    first = SimBackend(tmp_path, noise=0.0, clock=fake_clock)
    first.devices()[0].set_locked_sm_clock_mhz(1200)
    first.devices()[0].set_power_limit_w(250.0)
    first.close()
    assert (tmp_path / f"{first_uuid(tmp_path)}.state").exists()
    fake_clock.advance(1.0)
    second = SimBackend(tmp_path, noise=0.0, clock=fake_clock)
    device = second.devices()[0]
    assert device.locked_sm_clock_mhz() == 1200
    assert device.power_limit_w() == 250.0
    assert device.energy_mj() == round(A100_BLOCKING_W * 1000)
    second.close()
    third = SimBackend(tmp_path, noise=0.0, clock=fake_clock, fresh=True)
    assert third.devices()[0].locked_sm_clock_mhz() is None
    assert third.devices()[0].energy_mj() == 0
    third.close()


def first_uuid(sim_dir: Path) -> str:
    return sorted(sim_dir.glob("*.state"))[0].name.removesuffix(".state")


def test_fault_lost_makes_every_call_fail(sim_backend: SimBackend) -> None:
    device: SimDevice = sim_backend.sim_devices()[0]
    device.inject_fault("*", "lost")
    for call in (device.energy_mj, device.power_w, device.power_limit_w, device.reset_locked_sm_clock):
        with pytest.raises(GpuLostError) as caught:
            call()
        assert caught.value.uuid == device.info.uuid
    assert sim_backend.devices()[1].energy_mj() == 0
    device.clear_faults()
    assert device.energy_mj() == 0


def test_fault_error_on_one_operation_and_slow_call(sim_backend: SimBackend, fake_clock: FakeClock) -> None:
    device = sim_backend.sim_devices()[0]
    device.inject_fault("reset_locked_sm_clock", "error", error="no_permission")
    device.inject_fault("power_w", "slow", delay_s=0.25)
    with pytest.raises(GpuPermissionError, match="CAP_SYS_ADMIN"):
        device.reset_locked_sm_clock()
    assert device.set_locked_sm_clock_mhz(1200) == 1200
    device.power_w()
    assert fake_clock.sleeps_s == [0.25]
    with pytest.raises(GpuInvalidArgumentError):
        device.inject_fault("no_such_op", "error")


def test_faults_from_the_environment_target_one_gpu(tmp_path: Path) -> None:
    faults = [{"gpu": 1, "op": "set_power_limit_w", "kind": "error", "error": "timeout"}]
    backend = open_backend(
        "sim", sim_gpus=2, sim_dir=tmp_path, environ={"PERSEUSD_SIM_FAULTS": json.dumps(faults)}
    )
    try:
        first, second = backend.devices()
        assert first.set_power_limit_w(200.0) == 200.0
        with pytest.raises(GpuTimeoutError):
            second.set_power_limit_w(200.0)
    finally:
        backend.close()
    with pytest.raises(GpuInvalidArgumentError, match="PERSEUSD_SIM_FAULTS"):
        open_backend("sim", sim_dir=tmp_path, environ={"PERSEUSD_SIM_FAULTS": '[{"kind": "melt"}]'})


def test_files_have_the_requested_modes(tmp_path: Path) -> None:
    backend = SimBackend(tmp_path / "sim", state_mode=0o640, busy_mode=0o660)
    uuid = backend.devices()[0].info.uuid
    assert (tmp_path / "sim" / f"{uuid}.state").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "sim" / f"{uuid}.busy").stat().st_mode & 0o777 == 0o660
    backend.close()


def test_private_directory_is_removed_on_close() -> None:
    backend = SimBackend(None)
    sim_dir = backend.sim_dir
    assert any(sim_dir.iterdir())
    backend.close()
    assert not sim_dir.exists()

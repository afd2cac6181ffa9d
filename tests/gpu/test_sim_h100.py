"""The `h100_sxm` board against the measured H100 (`reference-data/h100`): power capping replays the
power-limit sweep, clock locks block and act part-way, idle power follows the clock, the counter's period."""

from __future__ import annotations

import csv
import itertools
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseusd.gpu.backend import CLOCK_EVENT_SW_POWER_CAP, power_capped
from perseusd.gpu.errors import GpuInvalidArgumentError
from perseusd.gpu.sim import SimBackend
from perseusd.gpu.sim_boards import load_board
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import read_profile
from perseusd.workload.sim_costs import WorkloadCosts
from perseusd.workload.sim_workload import SimGpuHandle

from .conftest import FakeClock


@pytest.fixture
def h100(tmp_path: Path, fake_clock: FakeClock) -> Iterator[SimBackend]:
    backend = SimBackend(
        tmp_path / "sim", model="h100_sxm", noise=0.0, clock=fake_clock, sleep=fake_clock.sleep
    )
    yield backend
    backend.close()


@pytest.fixture
def h100_profile(reference_data: Path) -> Profile:
    return read_profile(reference_data / "h100" / "gpt-4stage-profile.csv")


def test_the_board_shows_what_nvml_showed(reference_data: Path) -> None:
    probe = json.loads((reference_data / "h100" / "nvml-probe.json").read_text())["info"]
    board = load_board("h100_sxm")
    assert list(board.clocks_mhz) == probe["supported_sm_clocks_mhz"]
    assert (board.power_limit_min_w, board.power_limit_max_w, board.power_limit_default_w) == (
        probe["power_limit_min_w"],
        probe["power_limit_max_w"],
        probe["power_limit_default_w"],
    )


def test_the_power_limit_sweep_is_replayed_within_5_percent(
    reference_data: Path, h100: SimBackend, fake_clock: FakeClock, h100_profile: Profile
) -> None:
    """Stage 1 forward+backward, clocks unlocked, under each power limit of the sweep; the limits whose capped
    clock lies in the profile's range (900-1980 MHz) must reproduce the measured time and energy.

    700 W is the one exception on energy: the model runs the forward capped at 1770 MHz and the backward
    uncapped at 1980, and the profile's own rows there (measured with the clock locked) are 6-7 % below the
    unlocked run of the sweep (14.4 J against 15.3 J); its time is within 0.5 %."""
    rows = list(csv.DictReader((reference_data / "h100" / "power-limit-sweep.csv").read_text().splitlines()))
    device = h100.sim_devices()[0]
    low_mhz, high_mhz = min(h100_profile.frequencies_mhz()), max(h100_profile.frequencies_mhz())
    checked: list[float] = []
    below: list[float] = []
    with SimGpuHandle.open(
        h100.sim_dir, device.info.uuid, h100_profile, clock=fake_clock, sleep=fake_clock.sleep
    ) as gpu:
        for row in rows:
            limit_w = float(row["power_limit_w"])
            assert device.set_power_limit_w(limit_w) == limit_w
            forward, backward = gpu.run(1, "forward"), gpu.run(1, "backward")
            time_s, energy_j = forward.duration_s + backward.duration_s, forward.energy_j + backward.energy_j
            if not all(low_mhz <= r.ran_mhz <= high_mhz for r in (forward, backward)):
                # below the profile: the fitted costs (`below_clock`), +3-19 % over the real H100 (whose
                # power under a limit is below the profile's at its lowest clock); was +156 % at 300 W
                assert float(row["fwdbwd_time_s"]) <= time_s <= 1.2 * float(row["fwdbwd_time_s"])
                assert energy_j == pytest.approx(float(row["fwdbwd_energy_j"]), rel=0.2)
                assert max(forward.ran_mhz, backward.ran_mhz) < low_mhz
                below.append(limit_w)
                continue
            assert backward.clock_mhz == 1980  # unlocked: the top clock, lowered by the cap
            assert time_s == pytest.approx(float(row["fwdbwd_time_s"]), rel=0.05)
            energy_tolerance = 0.05 if limit_w < 700 else 0.07
            assert energy_j == pytest.approx(float(row["fwdbwd_energy_j"]), rel=energy_tolerance)
            if backward.capped:
                assert device.sm_clock_mhz() == backward.ran_mhz < 1980
                assert power_capped(device.clock_event_reasons())
            checked.append(limit_w)
    assert checked == [700.0, 600.0, 500.0, 450.0, 400.0, 350.0]
    assert below == [300.0, 250.0, 200.0]


def test_a_lock_above_the_capped_clock_changes_nothing_but_the_label(
    h100: SimBackend, fake_clock: FakeClock, h100_profile: Profile
) -> None:
    device = h100.sim_devices()[0]
    runs = []
    with SimGpuHandle.open(
        h100.sim_dir, device.info.uuid, h100_profile, clock=fake_clock, sleep=fake_clock.sleep
    ) as gpu:
        for lock_mhz in (1980, 1890, 1800):
            device.set_locked_sm_clock_mhz(lock_mhz)
            record = gpu.run(0, "backward")
            assert device.locked_sm_clock_mhz() == lock_mhz
            assert device.sm_clock_mhz() == record.ran_mhz
            assert device.clock_event_reasons() == CLOCK_EVENT_SW_POWER_CAP
            runs.append(record)
        device.set_locked_sm_clock_mhz(1395)
        uncapped = gpu.run(0, "backward")
    assert {r.clock_mhz for r in runs} == {1980, 1890, 1800}
    assert len({r.ran_mhz for r in runs}) == 1
    for run in runs[1:]:
        assert run.duration_s == pytest.approx(runs[0].duration_s, rel=1e-9)
        assert run.energy_j == pytest.approx(runs[0].energy_j, rel=1e-9)
    assert runs[0].capped
    assert runs[0].energy_j / runs[0].duration_s <= 700.0
    assert (uncapped.capped, uncapped.ran_mhz, device.clock_event_reasons()) == (False, 1395, 0)
    assert device.sm_clock_mhz() == 1395


class _LockWatch:
    """The daemon side's sleep: notes when, within each setter call, a workload first sees the new clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.handle: SimGpuHandle | None = None
        self.target_mhz = 0
        self.start_s = 0.0
        self.acted_s: float | None = None

    def begin(self, target_mhz: int) -> None:
        self.target_mhz, self.start_s, self.acted_s = target_mhz, self.clock(), None

    def __call__(self, duration_s: float) -> None:
        assert self.handle is not None
        if self.acted_s is None and self.handle.current_clock_mhz() == self.target_mhz:
            self.acted_s = self.clock() - self.start_s
        self.clock.advance(duration_s)


def test_a_clock_lock_blocks_the_caller_and_acts_part_way_through(
    reference_data: Path, tmp_path: Path, fake_clock: FakeClock
) -> None:
    """Like `nvmlDeviceSetGpuLockedClocks` on the H100 (`switch-dynamics.json`): the call blocks 9-15 ms and
    the new clock acts 0-12 ms after it starts, ~6 ms typically, down or up."""
    measured = json.loads((reference_data / "h100" / "switch-dynamics.json").read_text())["runs"]
    measured_call_ms = [run["call_ms_mean"] for run in measured]
    watch = _LockWatch(fake_clock)
    backend = SimBackend(tmp_path / "sim", model="h100_sxm", noise=0.0, clock=fake_clock, sleep=watch)
    device = backend.sim_devices()[0]
    watch.handle = SimGpuHandle.open(backend.sim_dir, device.info.uuid, clock=fake_clock, sleep=watch)
    calls_ms, acts_ms = [], []
    for target_mhz in [1200, 1980] * 40:
        watch.begin(target_mhz)
        assert device.set_locked_sm_clock_mhz(target_mhz) == target_mhz
        assert watch.handle.current_clock_mhz() == target_mhz
        call_s = fake_clock() - watch.start_s
        calls_ms.append(call_s * 1000)
        acts_ms.append((call_s if watch.acted_s is None else watch.acted_s) * 1000)
    watch.handle.close()
    backend.close()
    assert min(calls_ms) >= 9.0
    assert max(calls_ms) <= 15.0
    assert min(measured_call_ms) <= statistics.mean(calls_ms) <= max(measured_call_ms)
    assert max(acts_ms) <= 12.0
    assert 4.0 <= statistics.median(acts_ms) <= 8.0
    assert sum(0 < act < call for act, call in zip(acts_ms, calls_ms, strict=True)) >= 70


def test_a_power_limit_blocks_until_it_acts(h100: SimBackend, fake_clock: FakeClock) -> None:
    device = h100.sim_devices()[0]
    start_s = fake_clock()
    device.set_power_limit_w(250.0)
    lowered_s = fake_clock() - start_s
    device.set_power_limit_w(700.0)
    raised_s = fake_clock() - start_s - lowered_s
    assert lowered_s == pytest.approx(0.013)
    assert raised_s == pytest.approx(0.038)


def test_idle_power_follows_the_clock(reference_data: Path, h100: SimBackend, fake_clock: FakeClock) -> None:
    measured = json.loads((reference_data / "h100" / "switch-and-idle.json").read_text())["idle"]
    device = h100.sim_devices()[0]
    for point in measured:
        if point["clock"] is None:
            device.reset_locked_sm_clock()
        else:
            device.set_locked_sm_clock_mhz(point["clock"])
        before_j = device.true_energy_j()
        fake_clock.advance(2.0)
        idle_w = (device.true_energy_j() - before_j) / 2.0
        assert idle_w == pytest.approx(point["power_w"], rel=0.01)
        assert device.power_w() == pytest.approx(point["power_w"], rel=0.01)
    assert load_board("h100_sxm").idle_power_w(345) < load_board("h100_sxm").idle_power_w(900)


def test_the_energy_counter_moves_every_100_ms(
    reference_data: Path, h100: SimBackend, fake_clock: FakeClock
) -> None:
    measured = json.loads((reference_data / "h100" / "nvml-probe.json").read_text())["energy_counter"]
    device = h100.sim_devices()[0]
    changes_s, last_mj = [], device.energy_mj()
    for _ in range(1500):
        fake_clock.advance(0.001)
        now_mj = device.energy_mj()
        if now_mj != last_mj:
            changes_s.append(fake_clock())
            last_mj = now_mj
    periods_s = [b - a for a, b in itertools.pairwise(changes_s)]
    assert len(periods_s) >= 13
    assert statistics.median(periods_s) == pytest.approx(measured["median_period_s"], rel=0.01)


def test_a_profile_with_clocks_the_board_lacks_is_refused(h100: SimBackend) -> None:
    foreign = Profile.from_measurements(
        [
            Measurement(0, Instruction.FORWARD, 1000, 0.01, 3.0),
            Measurement(0, Instruction.FORWARD, 2100, 0.008, 3.5),
            Measurement(0, Instruction.BACKWARD, 1005, 0.02, 6.0),
        ],
        source="mine.csv",
    )
    uuid = h100.devices()[0].info.uuid
    with pytest.raises(GpuInvalidArgumentError, match=r"1000, 2100 MHz .*345-1980 MHz"):
        SimGpuHandle.open(h100.sim_dir, uuid, foreign)


def test_clocks_the_profile_lacks_are_interpolated_and_extrapolated(h100_profile: Profile) -> None:
    costs = WorkloadCosts(h100_profile, load_board("h100_sxm"))
    at_900, at_945 = costs.cost(1, "forward", 900), costs.cost(1, "forward", 945)
    between = costs.cost(1, "forward", 915)
    assert between.time_s == pytest.approx(at_900.time_s + (at_945.time_s - at_900.time_s) / 3)
    assert between.energy_j == pytest.approx(at_900.energy_j + (at_945.energy_j - at_900.energy_j) / 3)
    # below the profile: fitted (time ~ a + b/f, power ~ blocking + c f^k), continuous at 900 MHz
    near = costs.cost(1, "forward", 885)
    assert near.time_s == pytest.approx(at_900.time_s, rel=0.03)
    assert near.power_w == pytest.approx(at_900.power_w, rel=0.03)
    slower = [costs.cost(1, "forward", c) for c in range(885, 344, -15)]
    assert all(a.time_s < b.time_s and a.power_w > b.power_w for a, b in itertools.pairwise(slower))
    below = costs.cost(1, "forward", 450)
    assert at_900.time_s * 1.5 < below.time_s <= at_900.time_s * 2  # part of the time does not scale
    assert load_board("h100_sxm").blocking_power_w < below.power_w < at_900.power_w * 0.75
    assert len(costs.clocks_mhz) == 110

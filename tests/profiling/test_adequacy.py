"""Whether a measured profile can support a plan, and the reasons it cannot."""

from __future__ import annotations

from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import read_profile
from perseusd.profiling.adequacy import plan_problems
from tests.support.reference_data import H100

H100_PROFILE = H100 / "gpt-4stage-profile.csv"
CLOCKS_MHZ = (1410, 1200, 1005, 810)


def _profile(time_s: list[float], energy_j: list[float], clocks_mhz: tuple[int, ...] = CLOCKS_MHZ) -> Profile:
    rows = [
        Measurement(stage, instruction, clock, t, e)
        for stage in range(2)
        for instruction in (Instruction.FORWARD, Instruction.BACKWARD)
        for clock, t, e in zip(clocks_mhz, time_s, energy_j, strict=True)
    ]
    return Profile.from_measurements(rows, "test")


def test_a_real_gpus_curves_support_a_plan() -> None:
    assert plan_problems(read_profile(H100_PROFILE), counted_energy_j=1234.0) == []


def test_a_curve_that_moves_supports_a_plan() -> None:
    assert plan_problems(_profile([0.010, 0.011, 0.013, 0.016], [5.0, 4.6, 4.3, 4.4])) == []


def test_zero_energy_counters_are_named() -> None:
    profile = _profile([0.010, 0.011, 0.013, 0.016], [5.0, 4.6, 4.3, 4.4])
    [problem] = plan_problems(profile, counted_energy_j=0.0)
    assert "did not move" in problem
    assert "0 J" in problem


def test_flat_energy_and_times_are_named() -> None:
    """What a real PyTorch job on simulated GPUs that no workload drives measures: idle energy, CPU times."""
    problems = plan_problems(_profile([0.0100, 0.0101, 0.0099, 0.0100], [1.30, 1.30, 1.31, 1.30]))
    assert len(problems) == 2
    assert problems[0].startswith("energy does not move with the clock")
    assert problems[1].startswith("times do not follow the clock")


def test_times_that_fall_with_the_clock_do_not_follow_it() -> None:
    problems = plan_problems(_profile([0.016, 0.013, 0.011, 0.010], [5.0, 4.6, 4.3, 4.4]))
    assert [p.split(":")[0] for p in problems] == ["times do not follow the clock"]


def test_too_few_clocks() -> None:
    problems = plan_problems(_profile([0.010, 0.013], [5.0, 4.4], clocks_mhz=(1410, 1005)))
    assert problems == ["too few clocks: at most 2 per computation (a plan needs 3)"]


def test_every_computation_at_zero_joules() -> None:
    assert (
        plan_problems(_profile([0.010, 0.011, 0.013, 0.016], [0.0] * 4))[0]
        == "every computation measured 0 J"
    )


def test_nothing_measured() -> None:
    assert plan_problems(Profile.from_measurements([], "empty")) == ["nothing was measured"]

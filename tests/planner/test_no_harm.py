"""Do no harm: a stage keeps its plan only when the plan's saving clears its uncertainty and clock changes."""

from __future__ import annotations

import math

import pytest

from perseusd.planner.dag import Instruction, build_dag
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.no_harm import K_SIGMA, PlannedTimes, judge_stages, safe_clock_mhz
from perseusd.planner.profile import Measurement, Profile

F, B = Instruction.FORWARD, Instruction.BACKWARD
# A power-capped top like an H200's: 1980 and 1770 take the same time, 1770 for less energy; below, slower.
ROWS = {
    1980: (0.0065, 4.40, 0.0143, 9.87),
    1770: (0.0065, 4.30, 0.0143, 9.60),
    1560: (0.0072, 4.20, 0.0158, 9.30),
    1350: (0.0082, 4.05, 0.0180, 8.90),
}


def _profile(stages: int, weights: tuple[float, ...] | None = None) -> Profile:
    weights = weights or (1.0,) * stages
    rows = []
    for stage, weight in enumerate(weights):
        for clock, (f_s, f_j, b_s, b_j) in ROWS.items():
            rows.append(Measurement(stage, F, clock, f_s * weight, f_j * weight))
            rows.append(Measurement(stage, B, clock, b_s * weight, b_j * weight))
    return Profile.from_measurements(rows, "capped")


def test_the_safe_clock_is_the_cheapest_clock_no_slower_than_the_top() -> None:
    dag = build_dag("1f1b", 1, 4)
    assert safe_clock_mhz(dag, _profile(1), dag.stage_orders[0]) == 1770


def test_a_capped_clock_whose_light_computations_run_slower_is_safe_when_the_plan_still_fits() -> None:
    """A capped backward (1770 MHz as fast as 1980 would be, 1 ms faster than 1980 locked) beside an uncapped
    forward (0.2 ms slower at 1770): 1770 is slower for one computation, yet the stage's iteration is shorter,
    and running 1980 throughout would cost more and take longer than the plan."""
    rows = {
        1980: (0.0063, 4.40, 0.0153, 10.30),
        1770: (0.0065, 4.30, 0.0143, 9.60),
        1560: (0.0072, 4.20, 0.0158, 9.30),
    }
    profile = Profile.from_measurements(
        [
            Measurement(0, instruction, clock, time_s, energy_j)
            for clock, (f_s, f_j, b_s, b_j) in rows.items()
            for instruction, time_s, energy_j in ((F, f_s, f_j), (B, b_s, b_j))
        ],
        "capped, forward not",
    )
    dag = build_dag("1f1b", 1, 4)
    nodes = dag.stage_orders[0]
    assert safe_clock_mhz(dag, profile, nodes) == 1980  # per computation, only the top is no slower
    plan = [1770 if dag.computations[n].instruction == B else 1980 for n in range(dag.num_computations)]
    plan_s = evaluate_clocks(dag, profile, plan, 100.0).time_s
    planned = PlannedTimes(
        [profile.lookup(0, dag.computations[n].instruction, plan[n]).time_s for n in nodes], plan_s
    )
    assert safe_clock_mhz(dag, profile, nodes, planned) == 1770
    # 1560 costs less still, but the stage would be busier than at the top: not safe, whatever the slack.
    assert safe_clock_mhz(dag, profile, nodes, PlannedTimes(planned.times_s, 1.0)) == 1770
    [verdict] = judge_stages(dag, profile, plan, 100.0, plan_s, {}, 0.006)
    assert verdict.safe_clock_mhz == 1770
    assert not verdict.keep_plan  # 1770 throughout: cheaper than the plan, no switches, no slower


def test_a_one_stage_plan_that_saves_little_runs_the_safe_clock() -> None:
    dag = build_dag("1f1b", 1, 4)
    profile = _profile(1)
    # A plan that alternates 1980 and 1770 (same time): it saves less than running 1770 throughout.
    clocks = [1980 if i % 2 else 1770 for i in range(dag.num_computations)]
    time_s = 4 * (0.0065 + 0.0143)
    [verdict] = judge_stages(dag, profile, clocks, 130.0, time_s, {}, 0.006)
    assert not verdict.keep_plan
    assert verdict.safe_clock_mhz == 1770
    assert verdict.saving_j < 0  # the safe clock is the cheaper of the two
    assert verdict.switching_j > 0  # 8 changes per iteration, each a latency at the other clock's power
    assert "stage 0 runs 1770 MHz" in verdict.reason()


def test_an_off_critical_stage_with_real_slack_keeps_its_plan() -> None:
    dag = build_dag("1f1b", 2, 4)
    profile = _profile(2, (1.0, 1.3))  # stage 1 is the slow one: stage 0 waits for it
    clocks = [1350 if dag.computations[n].stage == 0 else 1770 for n in range(dag.num_computations)]
    rel_err = {(m.stage, m.instruction, m.freq_mhz): 0.01 for m in profile.measurements}
    time_s = 0.3
    verdicts = judge_stages(dag, profile, clocks, 130.0, time_s, rel_err, 0.006)
    by_stage = {v.stage: v for v in verdicts}
    assert by_stage[0].keep_plan
    assert by_stage[0].saving_j > by_stage[0].uncertainty_j + by_stage[0].switching_j
    assert 1 not in by_stage  # stage 1's plan is its safe clock throughout already: nothing to judge


def test_the_uncertainty_grows_with_the_options_errors_and_can_decide() -> None:
    dag = build_dag("1f1b", 1, 4)
    profile = _profile(1)
    # Every computation at 1560: less energy per computation than 1770 but slower; judged at a long iteration
    # time (no blocking power) the plan saves more than the safe clock, unless the errors say otherwise.
    clocks = [1560] * dag.num_computations
    time_s = 0.2
    exact = judge_stages(dag, profile, clocks, 0.0, time_s, {}, 0.0)[0]
    assert exact.keep_plan
    assert exact.uncertainty_j == 0.0
    noisy_err = {(0, F, 1560): 0.05, (0, B, 1560): 0.05, (0, F, 1770): 0.05, (0, B, 1770): 0.05}
    noisy = judge_stages(dag, profile, clocks, 0.0, time_s, noisy_err, 0.0)[0]
    expected_sigma = math.sqrt(
        (4 * 4.20 * 0.05) ** 2 + (4 * 9.30 * 0.05) ** 2 + (4 * 4.30 * 0.05) ** 2 + (4 * 9.60 * 0.05) ** 2
    )
    assert noisy.uncertainty_j == pytest.approx(K_SIGMA * expected_sigma)
    assert not noisy.keep_plan
    unknown = judge_stages(dag, profile, clocks, 0.0, time_s, {(0, F, 1560): math.inf}, 0.0)[0]
    assert unknown.uncertainty_j == math.inf
    assert not unknown.keep_plan


def test_a_stage_without_a_common_clock_keeps_its_plan_unjudged() -> None:
    dag = build_dag("1f1b", 1, 2)
    profile = Profile.from_measurements(
        [Measurement(0, F, 1980, 0.01, 5.0), Measurement(0, B, 1770, 0.02, 9.0)], "disjoint"
    )
    assert judge_stages(dag, profile, [1980, 1770, 1980, 1770], 100.0, 0.1, {}, 0.01) == []

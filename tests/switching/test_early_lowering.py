"""Lowering a clock before the running computation ends, where the plan's slack allows it."""

from __future__ import annotations

import time

import pytest

from perseusd.planner.dag import build_dag
from perseusd.planner.slack import slack_s, stage_slack_s
from perseusd.switching.early_changes import EarlyRaise
from perseusd.switching.plans import PlanBook
from tests.daemon.test_plans import CLOCKS_MHZ, PLAN, ManualOwner
from tests.switching.test_early_raise import B0, F0, F1, LEAD_NS, TIMES_S, ManualTimer

pytestmark = pytest.mark.timeout(30)


def test_slack_is_latest_minus_earliest_finish() -> None:
    dag = build_dag("1f1b", 2, 2)
    # Stage 0: F0 F1 B0 B1 (1, 1, 2, 2 s); stage 1: F0 B0 F1 B1 (1, 2, 1, 2 s). Critical path: s0 F0, s1 F0,
    # s1 B0, s1 F1, s1 B1, s0 B1; s0 F1 may end 2 s later (s0 B0 waits for s1 B0), s0 B0 1 s later.
    assert stage_slack_s(dag, [[1, 1, 2, 2], [1, 2, 1, 2]]) == [[0.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="3 times for a DAG of 8"):
        slack_s(dag, [1.0, 1.0, 1.0])


def test_a_lowering_with_slack_is_set_lead_before_the_expected_end() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = PlanBook(owner.submit, early=EarlyRaise(timer, LEAD_NS))
    slack = (0.005, 0.0, 0.0, 0.0)  # F0 (1410, then F1 at 1005) may end 5 ms late: over twice the lead
    plan = book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S, slack_s=slack)
    owner.complete_all()
    begun_ns = time.monotonic_ns()
    book.on_begin("GPU-a", F0, time.perf_counter_ns(), begun_ns)
    [(deadline_ns, _)] = timer.scheduled
    assert deadline_ns == begun_ns + int(TIMES_S[0] * 1e9) - LEAD_NS
    timer.fire_all()
    assert owner.clocks() == [1410, 1005]  # lowered while F0 still runs
    owner.complete_all()
    book.on_end("GPU-a", F0, time.perf_counter_ns())
    book.on_begin("GPU-a", F1, time.perf_counter_ns(), time.monotonic_ns())
    assert (plan.early_lowerings, plan.late) == (1, 0)  # F1 began at its clock


def test_a_lowering_with_less_slack_than_twice_the_lead_is_set_as_early_as_its_slack_allows() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = PlanBook(owner.submit, early=EarlyRaise(timer, LEAD_NS))
    book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S, slack_s=(0.003, 0.0, 0.0, 0.0))  # 3 ms: half, 1.5 ms early
    owner.complete_all()
    begun_ns = time.monotonic_ns()
    book.on_begin("GPU-a", F0, time.perf_counter_ns(), begun_ns)
    [(deadline_ns, _)] = timer.scheduled
    assert deadline_ns == begun_ns + int(TIMES_S[0] * 1e9) - 1_500_000


def test_no_slack_no_early_lowering() -> None:
    owner, timer = ManualOwner(), ManualTimer()
    book = PlanBook(owner.submit, early=EarlyRaise(timer, LEAD_NS))
    plan = book.set(
        "GPU-a", PLAN, CLOCKS_MHZ, TIMES_S, slack_s=(0.0015, 0.0, 0.0, 0.0)
    )  # half of it is under MIN_LOWER_LEAD_NS (1 ms): the end event lowers
    owner.complete_all()
    book.on_begin("GPU-a", F0, time.perf_counter_ns(), time.monotonic_ns())
    assert timer.scheduled == []
    book.on_end("GPU-a", F0, time.perf_counter_ns())  # the end event lowers it
    book.on_begin("GPU-a", F1, time.perf_counter_ns(), time.monotonic_ns())
    assert (plan.early_lowerings, plan.late) == (0, 1)  # F1 began before 1005 was applied
    book.on_begin("GPU-a", B0, time.perf_counter_ns(), time.monotonic_ns())
    with pytest.raises(ValueError, match="2 slacks for a plan of 4"):
        book.set("GPU-a", PLAN, CLOCKS_MHZ, TIMES_S, slack_s=(0.0, 0.0))

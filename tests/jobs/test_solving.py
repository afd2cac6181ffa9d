"""The solver worker returns the typed, frozen frontier across the process boundary, as solved in-process,
with how long each phase took, and its document is what the planner writes for the same points (the daemon
writes it only at its edges)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from perseusd.errors import PlanningError
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solve_worker import SolveWorker
from perseusd.jobs.solving import PlanningTimes, SolveInput, SolvePhases, solve
from perseusd.planner.plan import Frontier, PlanMeta, frontier_document, frontier_to_document
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.solver import SolverParams, solve_frontier
from perseusd.planner.switching import SwitchModel
from tests.support.slow_solve import greedy_or_fast, slow_or_fast
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

pytestmark = pytest.mark.timeout(120)

PROFILE = synthetic_profile(2, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
SHAPE = JobShape("1f1b", 2, 4, 1)


def _task(switch: SwitchModel | None) -> SolveInput:
    csv = profile_to_csv(PROFILE)
    return SolveInput("train", SHAPE, SHAPE.named_orders() or (), csv, PROFILE.source, 80.0, 0.001, switch)


def test_the_worker_returns_the_frontier_it_solved() -> None:
    worker = SolveWorker()
    try:
        worker.warm()
        worker.warm()  # once started, a no-op
        for switch in (None, SwitchModel(0.03, 0.032, min_run_s=0.05)):
            solved = worker.submit(_task(switch)).result(timeout=60)
            returned = solved.frontier
            assert isinstance(returned, Frontier)
            assert returned == solve(_task(switch)).frontier
            phases = solved.phases
            assert min(phases.fit_s, phases.frontier_s) > 0
            assert (phases.follow_s > 0, phases.descent_s > 0) == (switch is not None,) * 2
            assert (returned.switching is None) == (switch is None)
            first, second = returned.points[0].clocks_mhz, returned.points[1].clocks_mhz
            shared = [a is b for a, b in zip(first, second, strict=True) if a == b]
            assert shared  # consecutive points share a row
            assert all(shared)  # and equal rows stay one object through pickling
    finally:
        worker.close()


def test_the_document_is_the_planners() -> None:
    """Without switching, the worker's frontier writes the planner's document plus each point's refined
    time."""
    frontier = solve(_task(None)).frontier
    dag = SHAPE.dag(SHAPE.named_orders() or ())
    points = list(solve_frontier(dag, PROFILE, SolverParams(unit_time_s=0.001, p_block_w=80.0)))
    expected = frontier_document(dag, points, PlanMeta.for_dag(dag, PROFILE, 0.001, 80.0))
    for body, point in zip(expected["points"], points, strict=True):
        body["refined_time_s"] = point.refined_time_s
    assert json.dumps(frontier_to_document(frontier)) == json.dumps(expected)


def test_planning_times_name_every_phase_and_the_rest_is_transfer() -> None:
    times = PlanningTimes(1.0, SolvePhases(0.01, 0.02, 0.07, 0.4))
    assert times.transfer_s == pytest.approx(0.5)
    assert (
        times.describe() == "fit 0.010 s, frontier 0.020 s, follow 0.070 s, descent 0.400 s, transfer 0.500 s"
    )
    assert (
        PlanningTimes(0.1, SolvePhases(0.2, 0.0)).transfer_s == 0.0
    )  # clocks of two processes: never negative


def test_a_worker_closed_while_it_starts_leaves_nothing() -> None:
    worker = SolveWorker()
    worker.warm()  # starts on a thread of its own: close waits for it, then stops the process
    worker.close()
    assert worker._pool is None
    worker.close()  # closing twice is fine


def test_a_cancelled_solve_frees_the_worker_for_the_others() -> None:
    """The job of a long solve ended: its solve stops (the worker process with it) and the next user's
    small job does not wait behind it."""
    worker = SolveWorker(slow_or_fast)
    try:
        worker.submit(_task(None)).result(timeout=60)  # the worker process is up
        slow = worker.submit(dataclasses.replace(_task(None), job="slow"))
        small = worker.submit(_task(None))
        time.sleep(0.5)  # the worker took the slow solve
        worker.cancel(slow)
        assert slow.cancelled()
        started_s = time.monotonic()
        assert isinstance(small.result(timeout=30).frontier, Frontier)
        assert time.monotonic() - started_s < 20  # not behind the 60 s solve
        assert worker.cancelled == 1
        assert worker.inflight == 0
        worker.cancel(small)  # done: a no-op
        assert worker.cancelled == 1
    finally:
        worker.close()


def test_a_solve_past_the_memory_cap_fails_alone_and_the_worker_serves_on() -> None:
    """A solve needing more than `solver_memory_limit_mib` fails its own job with the reason; the same worker
    process then solves the next job (no OOM kill taking every queued solve with it)."""
    worker = SolveWorker(greedy_or_fast, memory_limit_mib=512)
    try:
        greedy = worker.submit(dataclasses.replace(_task(None), job="greedy"))
        modest = worker.submit(_task(None))
        with pytest.raises(PlanningError, match=r"more memory than the solver may use \(512 MiB"):
            greedy.result(timeout=60)
        assert modest.result(timeout=60).frontier == solve(_task(None)).frontier
    finally:
        worker.close()

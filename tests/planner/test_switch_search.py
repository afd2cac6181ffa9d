"""The switch-aware descent: followable plans searched on what the GPUs will really run."""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Callable

import pytest

from perseusd.ctl.frontier_cmd import render_frontier
from perseusd.planner.baselines import all_max
from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.descent_limits import (
    FAR_BUDGET_SHARE,
    FAR_SEARCH_STAGES,
    FAR_STEPS,
    HARD_SEARCH_COMPUTATIONS,
    HARD_SEARCH_LATENCY_S,
    MAX_LATE_FRACTION,
    TIGHT_LIMIT_BUDGET,
    deployable,
    descend_frontier,
    far_search_budget,
    searches_harder,
)
from perseusd.planner.descent_trials import Descent
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.following import PointFollower, follow_frontier
from perseusd.planner.plan import Frontier, PlanMeta, frontier_from_points, frontier_to_document
from perseusd.planner.plan_read import parse_frontier
from perseusd.planner.profile import Profile
from perseusd.planner.solver import SolverParams, solve_frontier
from perseusd.planner.switch_search import DescentSearch
from perseusd.planner.switching import (
    FollowablePoint,
    SwitchModel,
    followable_point,
    late_begins,
)
from perseusd.planner.waiting import WaitingPower
from tests.support.synthetic import synthetic_profile

H100 = SwitchModel(latency_s=0.012, lead_s=0.014, min_run_s=0.028)  # the daemon's model on an H100
CLOCKS_MHZ = (1410, 1230, 1050, 900)  # few profiled clocks, far apart, like the daemon's budgeted sweep
P_BLOCK_W = 90.0


@functools.cache
def _job(seed: int, model: SwitchModel = H100) -> tuple[Frontier, ComputationDag, Profile, float]:
    """A 4-stage, 8-microbatch job of 7-25 ms computations, its frontier followed under `model`, and
    all-max's predicted time."""
    profile = synthetic_profile(4, seed, clocks_mhz=CLOCKS_MHZ, base_time_s=0.007, imbalance=0.5)
    dag = build_dag("1f1b", 4, 8)
    points = list(solve_frontier(dag, profile, SolverParams(unit_time_s=0.0005, p_block_w=P_BLOCK_W)))
    meta = PlanMeta.for_dag(dag, profile, 0.0005, P_BLOCK_W)
    frontier = frontier_from_points(dag, points, meta, [p.refined_time_s for p in points])
    followed = follow_frontier(frontier, dag, profile, P_BLOCK_W, model)
    return followed, dag, profile, all_max(dag, profile, P_BLOCK_W).time_s


@functools.cache
def _descended(seed: int) -> Frontier:
    frontier, dag, profile, all_max_time_s = _job(seed)
    return descend_frontier(frontier, dag, profile, P_BLOCK_W, H100, all_max_time_s)


def _node_clocks(dag: ComputationDag, rows: tuple[tuple[int, ...], ...]) -> list[int]:
    clocks = [0] * dag.num_computations
    for ids, row in zip(dag.stage_orders, rows, strict=True):
        for node, clock in zip(ids, row, strict=True):
            clocks[node] = clock
    return clocks


def _least_energy_within(frontier: Frontier, limit_s: float) -> float:
    """The least energy of a deployable point within `limit_s` (the points a policy chooses among)."""
    points = [frontier.points[k] for k in deployable(frontier.points)]
    return min(
        (p.refined_energy_j for p in points if p.predicted_time_s <= limit_s * (1 + 1e-9)), default=math.inf
    )


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_the_descent_keeps_more_of_the_saving_within_all_max_time(seed: int) -> None:
    """At all-max's time the descent's point needs less energy than every followed solver point, states
    its effective plan, and is chosen by figures no better than that plan's: its time is within the limit
    even where a lowering takes effect early."""
    frontier, dag, profile, all_max_time_s = _job(seed)
    descended = _descended(seed)
    assert descended.points[: len(frontier.points)] == frontier.points  # the solver's points stay
    new = descended.points[len(frontier.points) :]
    at_all_max = [p for p in new if p.predicted_time_s <= all_max_time_s * (1 + 1e-9)]
    assert at_all_max, "no descent improved on the followed frontier at all-max's time"
    first = at_all_max[0]
    assert first.followed is not None
    assert first.followed.descended_from is not None
    assert first.index == descended.points.index(first)
    assert sum(
        late_begins(row, _time_at(dag, profile, s), H100) for s, row in enumerate(first.clocks_mhz)
    ) <= (MAX_LATE_FRACTION * dag.num_computations)
    assert first.predicted_time_s <= all_max_time_s * (1 + 1e-9)
    assert first.refined_energy_j < _least_energy_within(frontier, all_max_time_s)
    followed = _followed(dag, profile, first.clocks_mhz)
    assert followed.clocks_mhz == first.followed.effective_clocks_mhz
    effective = evaluate_clocks(dag, profile, _node_clocks(dag, followed.clocks_mhz), P_BLOCK_W)
    judged_time_s, judged_energy_j = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100)).evaluate(
        first.clocks_mhz
    )
    assert first.refined_time_s == pytest.approx(judged_time_s)
    assert first.refined_energy_j == pytest.approx(judged_energy_j)
    assert first.predicted_time_s >= effective.time_s * (1 - 1e-12)
    assert first.refined_energy_j >= effective.energy_j * (1 - 1e-12)
    planned = evaluate_clocks(dag, profile, _node_clocks(dag, first.clocks_mhz), P_BLOCK_W)
    assert planned.time_s <= all_max_time_s * (1 + 1e-9)  # a lowering that acts early slows nothing
    for point in new:
        assert point.refined_energy_j < _least_energy_within(frontier, point.predicted_time_s)


def test_the_conservative_time_counts_every_lowering_both_ways() -> None:
    """The time a descent is held to is at least the plan's time with instant switches and its time as
    followed, for plans with many short runs."""
    _frontier, dag, profile, _ = _job(4)
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))
    rng = random.Random(7)
    for _ in range(20):
        rows = tuple(
            tuple(_snap(dag, profile, s, k, rng.choice(CLOCKS_MHZ)) for k in range(len(ids)))
            for s, ids in enumerate(dag.stage_orders)
        )
        time_s, _energy_j = search.evaluate(rows)
        planned = evaluate_clocks(dag, profile, _node_clocks(dag, rows), P_BLOCK_W)
        effective_rows = _followed(dag, profile, rows).clocks_mhz
        effective = evaluate_clocks(dag, profile, _node_clocks(dag, effective_rows), P_BLOCK_W)
        assert time_s >= max(planned.time_s, effective.time_s) * (1 - 1e-12)


def test_a_descent_is_deterministic_bounded_and_refuses_a_start_it_cannot_bring_within_its_limit() -> None:
    _frontier, dag, profile, all_max_time_s = _job(2)
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))
    first = search.descend(search.all_max(), all_max_time_s, 5000)
    again = search.descend(search.all_max(), all_max_time_s, 5000)
    assert first is not None
    assert first == again
    assert first.evaluations <= 5000
    assert first.time_s <= all_max_time_s * (1 + 1e-9)
    short = search.descend(search.all_max(), all_max_time_s, 10)
    assert short is not None
    assert short.evaluations == 10
    assert search.descend(search.all_max(), all_max_time_s * 0.9, 5000) is None


def test_a_start_over_its_limit_is_first_brought_within_it_by_raising_clocks() -> None:
    """The solver rounds each computation's time down to its unit, so its fastest point can end after
    all-max; a descent from it raises the runs or computations that shorten the plan for the least energy
    until it fits, and keeps most of its saving."""
    frontier, dag, profile, _all_max_time_s = _job(2)
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))
    base_s, base_j = search.evaluate(search.all_max())
    limit_s = base_s * 1.005
    over = [p for p in frontier.points if search.evaluate(p.clocks_mhz)[0] > base_s * 1.01]
    start = min(over, key=lambda p: p.predicted_time_s)  # a point 1-2 % slower than all-max
    found = search.descend(start.clocks_mhz, limit_s, 50_000)
    assert found is not None
    assert found.time_s <= limit_s * (1 + 1e-9)
    assert found.energy_j < base_j
    assert found.moves >= 1


def test_a_descent_keeps_to_its_cap_on_computations_begun_before_their_clock() -> None:
    """Capped at none, every stage of the plan keeps one clock (any change makes a computation begin before
    its clock is applied); uncapped, the descent trades some of them for energy."""
    _frontier, dag, profile, all_max_time_s = _job(3)
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))

    def late(rows: tuple[tuple[int, ...], ...]) -> int:
        return sum(late_begins(row, _time_at(dag, profile, s), H100) for s, row in enumerate(rows))

    assert late(search.all_max()) == 0
    capped = search.descend(search.all_max(), all_max_time_s, 20_000, max_late=0)
    free = search.descend(search.all_max(), all_max_time_s, 20_000)
    assert capped is not None
    assert free is not None
    assert late(capped.clocks_mhz) == 0
    assert all(len(set(row)) == 1 for row in capped.clocks_mhz)
    assert late(free.clocks_mhz) > 0
    assert free.energy_j < capped.energy_j <= search.evaluate(search.all_max())[1]


def test_a_start_with_too_many_late_begins_is_repaired_first() -> None:
    """From the followed point with the most computations begun early within all-max's time, a descent
    capped at half as many ends within the cap and the time limit."""
    frontier, dag, profile, all_max_time_s = _job(5)
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))

    def late(rows: tuple[tuple[int, ...], ...]) -> int:
        return sum(late_begins(row, _time_at(dag, profile, s), H100) for s, row in enumerate(rows))

    within = [p for p in frontier.points if p.predicted_time_s <= all_max_time_s * (1 + 1e-9)]
    start = max(within, key=lambda p: late(p.clocks_mhz))
    cap = late(start.clocks_mhz) // 2
    assert cap >= 2
    repaired = search.descend(start.clocks_mhz, all_max_time_s, 60_000, max_late=cap)
    assert repaired is not None
    assert late(repaired.clocks_mhz) <= cap
    assert repaired.time_s <= all_max_time_s * (1 + 1e-9)


def test_a_plan_that_begins_too_many_computations_late_is_not_deployed() -> None:
    """Every point states its late begins as the model counts them; the points a policy may choose are those
    within the cap, one of them within all-max's time; the descent adds deployable points."""
    descended, (_frontier, dag, profile, all_max_time_s) = _descended(7), _job(7)
    cap = MAX_LATE_FRACTION * dag.num_computations
    for point in descended.points:
        assert point.followed is not None
        rows = point.clocks_mhz
        counted = sum(late_begins(row, _time_at(dag, profile, s), H100) for s, row in enumerate(rows))
        assert point.followed.late_begins == counted
    chosen = deployable(descended.points)
    assert all(descended.points[k].followed.late_begins <= cap for k in chosen)  # type: ignore[union-attr]
    over = [p for k, p in enumerate(descended.points) if k not in chosen]
    assert any(p.predicted_time_s <= all_max_time_s * (1 + 1e-9) for p in over)
    assert any(descended.points[k].predicted_time_s <= all_max_time_s * (1 + 1e-9) for k in chosen)
    assert any(descended.points[k].followed.descended_from is not None for k in chosen)  # type: ignore[union-attr]


def test_a_start_over_the_cap_is_repaired_by_merging_runs() -> None:
    """A plan with many more late begins than the cap, from a profile with every clock (a scan of every
    segment at every clock outlasts the budget), is repaired by merging short runs into their neighbours:
    within the cap and the time limit, and nearer the start's energy than all-max."""
    frontier, dag, profile, all_max_time_s = _job(5)
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))
    within = [p for p in frontier.points if p.predicted_time_s <= all_max_time_s * (1 + 1e-9)]
    start = min(within, key=lambda p: p.refined_energy_j)
    cap = search.late(start.clocks_mhz) // 2
    assert cap >= 3
    repaired = search.descend(start.clocks_mhz, all_max_time_s, 20_000, max_late=cap)
    assert repaired is not None
    assert search.late(repaired.clocks_mhz) <= cap
    assert repaired.time_s <= all_max_time_s * (1 + 1e-9)
    start_j, all_max_j = search.evaluate(start.clocks_mhz)[1], search.evaluate(search.all_max())[1]
    assert repaired.energy_j < all_max_j
    assert repaired.energy_j - start_j < (all_max_j - start_j) / 2


def test_instant_switches_add_no_point() -> None:
    """Without switch latency every followed point is the solver's: the descent has nothing to repair."""
    instant = SwitchModel(0.0, 0.0)
    frontier, dag, profile, all_max_time_s = _job(1, instant)
    assert descend_frontier(frontier, dag, profile, P_BLOCK_W, instant, all_max_time_s) == frontier


def test_a_descended_frontier_is_written_and_read_back_as_it_is() -> None:
    frontier, _dag, _profile, _ = _job(4)
    descended = _descended(4)
    assert len(descended.points) > len(frontier.points)
    text = json.dumps(frontier_to_document(descended))
    assert '"descended_from"' in text
    assert parse_frontier(text, "descended") == descended


def _followed(dag: ComputationDag, profile: Profile, rows: tuple[tuple[int, ...], ...]) -> FollowablePoint:
    """What the GPUs will really run of `rows` under the H100 model."""
    follower = PointFollower(dag, profile, P_BLOCK_W, H100)
    return followable_point(rows, follower.time_at, follower.snap_up, H100)


def _time_at(dag: ComputationDag, profile: Profile, stage: int) -> Callable[[int, int], float]:
    return PointFollower(dag, profile, P_BLOCK_W, H100).time_at(stage)


def _snap(dag: ComputationDag, profile: Profile, stage: int, k: int, clock_mhz: int) -> int:
    return PointFollower(dag, profile, P_BLOCK_W, H100).snap_up(stage)(k, clock_mhz)


def test_perseusctl_frontier_prints_what_the_gpus_will_run() -> None:
    """The table's time is each point's switch-aware time, a descended point names its start, and a point
    over the late cap says it is not deployed."""
    descended = _descended(4)
    new = descended.points[-1]
    assert new.followed is not None
    lines = render_frontier(descended, "j", deployed=new.index).splitlines()
    row = next(line for line in lines if line.startswith(f"{new.index} "))
    assert f"{new.predicted_time_s:.4f}" in row.split()
    assert row.endswith(f"<- deployed (descent from {new.followed.descended_from})")
    solver_row = next(line for line in lines if line.startswith("0 "))
    assert f"{descended.points[0].predicted_time_s:.4f}" in solver_row.split()
    over = next(p for k, p in enumerate(descended.points) if k not in deployable(descended.points))
    assert over.followed is not None
    over_row = next(line for line in lines if line.startswith(f"{over.index} "))
    assert over_row.endswith(f"(not deployable: {over.followed.late_begins} begin before their clock)")
    assert "not deployable" not in row


def test_with_a_waiting_power_the_descent_judges_waits_at_the_clocks_held() -> None:
    """The descent's figure for its plan: the effective plan's computations plus its waits at the clocks held
    (`PointFollower.waiting_j` at the descent's time), what the prediction counts; its points at every limit
    (each descended, even where following lost little); every figure below the same plan's with the waits
    at the blocking power when the plan lowers clocks."""
    frontier, dag, profile, all_max_time_s = _job(3)
    waiting = WaitingPower(P_BLOCK_W, ((900, 55.0), (1230, 70.0), (1410, P_BLOCK_W)))
    search = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100, waiting))
    blocking = DescentSearch(PointFollower(dag, profile, P_BLOCK_W, H100))
    found = search.descend(search.all_max(), all_max_time_s * 1.1, 20_000, None)
    assert found is not None
    assert found.moves > 0
    effective = search.follower.follow(frontier.points[0], found.clocks_mhz, 0.0, 0.0, None).followed
    assert effective is not None
    compute_j = evaluate_clocks(
        dag, profile, _node_clocks(dag, effective.effective_clocks_mhz), P_BLOCK_W
    ).compute_energy_j
    held_j = search.follower.waiting_j(found.clocks_mhz, found.time_s)[1]
    assert found.energy_j == pytest.approx(compute_j + held_j, rel=1e-12)
    time_s, blocking_j = blocking.evaluate(found.clocks_mhz)
    assert time_s == found.time_s
    assert found.energy_j < blocking_j
    descended = descend_frontier(frontier, dag, profile, P_BLOCK_W, H100, all_max_time_s, waiting=waiting)
    new = [p for p in descended.points if p.followed is not None and p.followed.descended_from is not None]
    assert new


DENSE_MHZ = tuple(range(1410, 884, -15))  # a filled profile: a clock every 15 MHz (docs/profiling.md)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_far_moves_reach_low_clocks_that_near_moves_approach_step_by_step(seed: int) -> None:
    """On a profile with a clock every 15 MHz, a near move shifts a run by at most 45 MHz; with the same
    budget from all-max, far moves (`FAR_STEPS`) reach a lower energy, with runs far below the top."""
    profile = synthetic_profile(4, seed, clocks_mhz=DENSE_MHZ, base_time_s=0.007, imbalance=0.5)
    dag = build_dag("1f1b", 4, 8)
    follower = PointFollower(dag, profile, P_BLOCK_W, H100)
    limit_s = all_max(dag, profile, P_BLOCK_W).time_s
    budget = 300
    near = DescentSearch(follower).descend(DescentSearch(follower).all_max(), limit_s, budget)
    far_search = DescentSearch(follower, near_steps=FAR_STEPS)
    far = far_search.descend(far_search.all_max(), limit_s, budget)
    assert near is not None
    assert far is not None
    assert far.energy_j < near.energy_j
    assert min(min(row) for row in far.clocks_mhz) <= max(DENSE_MHZ) - 200
    assert far.time_s <= limit_s * (1 + 1e-9)


def test_only_long_pipelines_on_slow_locks_get_the_harder_search() -> None:
    """Sixteen times the budget cost a small job's planning step a second for nothing; it goes to jobs of
    `HARD_SEARCH_COMPUTATIONS` computations or more on GPUs with a slow lock. A shorter job of
    `FAR_SEARCH_STAGES` stages or more on a slow lock still gets the far descent, on `FAR_BUDGET_SHARE`
    times a descent's budget; a shorter pipeline or a sub-millisecond lock none."""
    long_dag, short_dag = build_dag("1f1b", 8, 16), build_dag("1f1b", 4, 16)
    assert long_dag.num_computations >= HARD_SEARCH_COMPUTATIONS > short_dag.num_computations
    assert searches_harder(long_dag, H100)
    assert not searches_harder(short_dag, H100)
    quick = SwitchModel(latency_s=HARD_SEARCH_LATENCY_S / 10, lead_s=0.0021, min_run_s=0.0042)
    assert not searches_harder(long_dag, quick)
    deep_dag = build_dag("1f1b", FAR_SEARCH_STAGES, 8)
    assert deep_dag.num_computations < HARD_SEARCH_COMPUTATIONS
    assert short_dag.num_stages < FAR_SEARCH_STAGES
    budget = 1000
    assert far_search_budget(long_dag, H100, budget) == budget * TIGHT_LIMIT_BUDGET
    far = far_search_budget(deep_dag, H100, budget)
    assert far == int(budget * FAR_BUDGET_SHARE) < budget * TIGHT_LIMIT_BUDGET
    assert far_search_budget(short_dag, H100, budget) == 0
    assert far_search_budget(long_dag, quick, budget) == far_search_budget(deep_dag, quick, budget) == 0


@pytest.mark.parametrize("seed", [4, 5])
def test_the_no_slowdown_descent_starts_from_every_slower_limits_plan(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which basin a repaired plan's descent ends in turns on small differences, so the deployed limit's
    descent starts from each plan the slower limits added, not only the least-energy one."""
    frontier, dag, profile, all_max_time_s = _job(seed)
    starts: dict[float, list[tuple[tuple[int, ...], ...]]] = {}
    descend = DescentSearch.descend

    def recording(
        self: DescentSearch,
        start: tuple[tuple[int, ...], ...],
        limit_s: float,
        budget: int,
        max_late: int | None,
        **priced: float,
    ) -> Descent | None:
        if max_late is not None:  # a start (not `reallocate`'s priced pass)
            starts.setdefault(round(limit_s / all_max_time_s, 3), []).append(start)
        return descend(self, start, limit_s, budget, max_late, **priced)

    monkeypatch.setattr(DescentSearch, "descend", recording)
    descended = descend_frontier(frontier, dag, profile, P_BLOCK_W, H100, all_max_time_s)
    added = list(descended.points[len(frontier.points) :])
    if added and added[-1].predicted_time_s <= all_max_time_s * (1 + 1e-9):
        added = added[:-1]  # the no-slowdown limit's own plan
    assert len({p.clocks_mhz for p in added}) >= 2  # else this checks nothing
    assert all(p.clocks_mhz in starts[1.0] for p in added)
    slower = [factor for factor in starts if factor > 1.0]
    assert all(len(starts[factor]) <= 3 for factor in slower)  # there: the least-energy one only

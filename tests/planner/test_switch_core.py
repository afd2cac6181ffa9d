"""The C core of plan following and the switch-aware descent against its Python specification: the same bits.

The descent's results must not depend on whether the C extension was built, and following a frontier must
give what `evaluate_clocks` gives for the effective plan.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import replace
from itertools import accumulate

import pytest

from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.planner.evaluate import LongestPath, dag_arrays, evaluate_clocks, longest_path_s, stage_ptr_of
from perseusd.planner.following import PointFollower
from perseusd.planner.plan import Plan, PlanMeta
from perseusd.planner.profile import Profile
from perseusd.planner.switch_core import PyCore, ScanLimits, StageCost, SwitchCore, switch_core
from perseusd.planner.switch_search import DescentSearch
from perseusd.planner.switching import StageOptions, SwitchModel
from perseusd.planner.waiting import HeldWaits, WaitingPower, held_waiting_j
from tests.support.synthetic import synthetic_profile

H100 = SwitchModel(latency_s=0.012, lead_s=0.014, min_run_s=0.028)
QUICK = SwitchModel(latency_s=6e-5, lead_s=0.00206, min_run_s=0.0041)  # a simulated A100's
IDLE = WaitingPower(124.0, ((900, 79.12), (1440, 99.97), (1980, 124.0)))
"""A waiting power falling with the held clock (the `h100_sxm` board's idle points)."""


def _c_core_or_skip() -> None:
    from perseusd.planner import switch_core as module

    if module._C_CORE is None:
        pytest.skip("the C switch core was not built (scripts/setup.sh builds it)")


def _cases() -> list[tuple[ComputationDag, Profile, SwitchModel]]:
    return [
        (build_dag("1f1b", 4, 8), bundled_profile("h100_sxm"), H100),
        (build_dag("1f1b", 3, 5), synthetic_profile(3, 11, base_time_s=0.007, imbalance=0.5), H100),
        (build_dag("gpipe", 2, 6), synthetic_profile(2, 5, base_time_s=0.02), QUICK),
        (build_dag("interleaved", 2, 4, 2), synthetic_profile(4, 7, base_time_s=0.01), H100),
    ]


def _random_row(stage: StageOptions, rng: random.Random) -> list[int]:
    """A row of measured clocks in runs (what plans look like), sometimes one clock throughout."""
    row: list[int] = []
    while len(row) < len(stage.clocks_mhz):
        clock = rng.choice(stage.all_clocks_mhz)
        row.extend([clock] * rng.randint(1, 5))
    return [stage.snap_up(k, clock) for k, clock in enumerate(row[: len(stage.clocks_mhz)])]


@pytest.mark.parametrize("waiting", [None, IDLE], ids=["blocking", "held"])
@pytest.mark.parametrize("case", range(4))
def test_the_c_core_gives_the_pythons_bits(case: int, waiting: WaitingPower | None) -> None:
    _c_core_or_skip()
    dag, profile, model = _cases()[case]
    stages = [StageOptions(dag, profile, s) for s in range(dag.num_stages)]
    c_core = switch_core(dag, stages, model, waiting=waiting)
    py_core = switch_core(dag, stages, model, use_c=False, waiting=waiting)
    assert isinstance(py_core, PyCore)
    rng = random.Random(case)
    held = 0
    for _ in range(60):
        for stage, options in enumerate(stages):
            row = _random_row(options, rng)
            assert c_core.stage_cost(stage, row) == py_core.stage_cost(stage, row)
            time_s = c_core.trial_time(stage)
            assert time_s == py_core.trial_time(stage)
            waits_j = c_core.trial_waits(stage, time_s * 1.01)
            assert waits_j == py_core.trial_waits(stage, time_s * 1.01)
            held += waits_j > 0.0
            if rng.random() < 0.5:
                c_core.accept(stage)
                py_core.accept(stage)
    assert held == (0 if waiting is None else 60 * dag.num_stages)


ScanSetup = tuple[
    ComputationDag, list[StageOptions], list[SwitchCore], list[list[int]], list[StageCost], random.Random
]


def _scan_setup(case: int, waiting: WaitingPower | None, seed: int) -> ScanSetup:
    """The C and Python cores of a case with the same random plan accepted in both."""
    dag, profile, model = _cases()[case]
    stages = [StageOptions(dag, profile, s) for s in range(dag.num_stages)]
    cores = [switch_core(dag, stages, model, True, waiting), switch_core(dag, stages, model, False, waiting)]
    rng = random.Random(seed + case)
    rows = [_random_row(options, rng) for options in stages]
    costs: list[StageCost] = []
    for core in cores:
        costs = [core.stage_cost(stage, row) for stage, row in enumerate(rows)]
        for stage in range(dag.num_stages):
            core.accept(stage)
    return dag, stages, cores, rows, costs, rng


def _plan_now(
    dag: ComputationDag, core: SwitchCore, costs: list[StageCost], waiting: WaitingPower | None
) -> tuple[int, float, float]:
    """The accepted plan's (late begins, time, energy at a blocking power of 124 W or its held waits)."""
    late = sum(cost[2] for cost in costs)
    time_s = core.trial_time(0)  # stage 0's trial is its current durations: the plan's time
    if waiting is None:
        energy_j = sum(c[0] for c in costs) + 124.0 * (dag.num_stages * time_s - sum(c[1] for c in costs))
    else:
        energy_j = sum(c[0] for c in costs) + core.trial_waits(0, time_s)
    return late, time_s, energy_j


def _random_limits(
    dag: ComputationDag,
    costs: list[StageCost],
    stage: int,
    late: int,
    time_s: float,
    energy_j: float,
    rng: random.Random,
) -> ScanLimits:
    """Limits that some trials meet and some budgets that run out."""
    before, after = costs[:stage], costs[stage + 1 :]
    return ScanLimits(
        late,
        late - costs[stage][2],
        rng.choice([late, late // 2, dag.num_computations]),
        rng.random() < 0.3,
        time_s * rng.uniform(0.97, 1.1),
        rng.choice([math.inf, energy_j * rng.uniform(0.97, 1.02)]),
        sum(c[0] for c in before),
        sum(c[1] for c in before),
        tuple((c[0], c[1]) for c in after),
        124.0,
        dag.num_stages,
        rng.choice([0, 7, 50, 100_000]),
        rng.choice([0.0, 0.0, energy_j / dag.num_computations]),  # a late begin's price, at times
    )


@pytest.mark.parametrize("waiting", [None, IDLE], ids=["blocking", "held"])
@pytest.mark.parametrize("case", range(4))
def test_the_c_scan_gives_the_pythons_moves(case: int, waiting: WaitingPower | None) -> None:
    """A stage's moves judged in C: the same evaluations, budget end and best move as the Python loop,
    repairing or not, with bounds that some moves beat and budgets that run out; with waits charged at the
    held clock too."""
    _c_core_or_skip()
    dag, _stages, cores, rows, costs, rng = _scan_setup(case, waiting, 10)
    late, time_s, energy_j = _plan_now(dag, cores[1], costs, waiting)
    found = 0
    for _ in range(12):
        stage = rng.randrange(dag.num_stages)
        limits = _random_limits(dag, costs, stage, late, time_s, energy_j, rng)
        results = [core.scan(stage, rows[stage], *limits.args()) for core in cores]
        assert results[0] == results[1]
        found += results[0][2] is not None
    assert found > 0
    with pytest.raises(ValueError, match="more stages"):
        cores[0].scan(0, rows[0], *(*limits.args()[:8], ((1.0, 1.0),) * dag.num_stages, *limits.args()[9:]))


@pytest.mark.parametrize("waiting", [None, IDLE], ids=["blocking", "held"])
@pytest.mark.parametrize("case", range(4))
def test_the_c_judge_rows_gives_the_pythons_best(case: int, waiting: WaitingPower | None) -> None:
    """Given rows judged in C (the descent's coarse moves and merge repair): the same evaluations, budget end
    and best row as the Python loop, by energy and by energy per late begin removed."""
    _c_core_or_skip()
    dag, stages, cores, _rows, costs, rng = _scan_setup(case, waiting, 30)
    late, time_s, energy_j = _plan_now(dag, cores[1], costs, waiting)
    found = {None: 0, energy_j: 0}
    for _ in range(16):
        stage = rng.randrange(dag.num_stages)
        limits = _random_limits(dag, costs, stage, late, time_s, energy_j, rng)
        trials = [_random_row(stages[stage], rng) for _ in range(rng.randint(0, 40))]
        for per_late_from_j in found:
            results = [core.judge_rows(stage, trials, per_late_from_j, *limits.args()) for core in cores]
            assert results[0] == results[1]
            found[per_late_from_j] += results[0][2] is not None
    assert all(found.values()), found


@pytest.mark.parametrize("waiting", [None, IDLE], ids=["blocking", "held"])
def test_descents_are_the_same_with_and_without_c(waiting: WaitingPower | None) -> None:
    _c_core_or_skip()
    dag, profile, model = _cases()[0]
    searches = [
        DescentSearch(PointFollower(dag, profile, 124.0, model, waiting), use_c) for use_c in (True, False)
    ]
    start = searches[0].all_max()
    limit_s = searches[0].evaluate(start)[0] * 1.02
    found = [search.descend(start, limit_s, 3000, max_late=6) for search in searches]
    assert found[0] is not None
    assert found[0].moves > 0
    assert found[0] == found[1]
    price_j = found[0].energy_j / dag.num_computations
    priced = [search.descend(start, limit_s, 3000, late_price_j=price_j) for search in searches]
    assert priced[0] is not None
    assert priced[0] == priced[1]


@pytest.mark.parametrize("case", range(4))
def test_the_c_merge_gives_the_pythons_rows(case: int) -> None:
    _c_core_or_skip()
    dag, profile, model = _cases()[case]
    stages = [StageOptions(dag, profile, s) for s in range(dag.num_stages)]
    cores = [switch_core(dag, stages, model, use_c=use_c) for use_c in (True, False)]
    rng = random.Random(case)
    merged = 0
    for _ in range(60):
        for stage, options in enumerate(stages):
            row = _random_row(options, rng)
            min_run_s = rng.choice((0.0, model.min_run_s, 4 * model.min_run_s, 1.0))
            found = [core.merged(stage, row, min_run_s) for core in cores]
            assert found[0] == found[1]
            assert cores[0].follow_row(stage, found[0]) == cores[1].follow_row(stage, found[0])
            merged += found[0] != row
            if min_run_s == 0.0:
                assert found[0] == row
    assert merged > 20


def test_held_waits_are_the_pythons() -> None:
    rng = random.Random(7)
    for dag, profile, model in _cases():
        stages = [StageOptions(dag, profile, s) for s in range(dag.num_stages)]
        waits = [HeldWaits(dag, model.latency_s, use_c) for use_c in (True, False)]
        for _ in range(20):
            clocks = [c for options in stages for c in _random_row(options, rng)]
            waits_w = [IDLE.at_w(clock) for clock in clocks]
            times_s = [rng.uniform(0.001, 0.05) for _ in clocks]
            time_s = longest_path_s(dag, times_s) * rng.uniform(1.0, 1.2)
            expected = held_waiting_j(dag, times_s, clocks, time_s, IDLE, model.latency_s)
            assert expected > 0.0
            assert [held(clocks, waits_w, times_s, time_s) for held in waits] == [expected, expected]


@pytest.mark.parametrize("waiting", [None, IDLE], ids=["blocking", "held"])
def test_following_is_the_same_with_and_without_c(waiting: WaitingPower | None) -> None:
    """Merged rows, effective clocks, late begins and every figure of a followed plan: the same bits."""
    dag, profile, model = _cases()[0]
    followers = [PointFollower(dag, profile, 124.0, model, waiting, use_c) for use_c in (True, False)]
    rng = random.Random(11)
    for _ in range(20):
        rows = tuple(tuple(_random_row(options, rng)) for options in followers[0].stages)
        plans = []
        for follower in followers:
            merged = tuple(tuple(follower.merged(s, row, {})) for s, row in enumerate(rows))
            plans.append(follower.follow(_plan_stub(dag, profile, rows), merged, 1.0, 2.0, rows))
        assert plans[0] == plans[1]


def test_stage_ptr_needs_nodes_numbered_stage_by_stage() -> None:
    dag = _cases()[0][0]
    assert list(stage_ptr_of(dag)) == [0, *accumulate(len(ids) for ids in dag.stage_orders)]
    swapped = (dag.stage_orders[1], dag.stage_orders[0], *dag.stage_orders[2:])
    with pytest.raises(ValueError, match="stage by stage"):
        stage_ptr_of(replace(dag, stage_orders=swapped))


def test_the_longest_path_is_the_pythons() -> None:
    rng = random.Random(3)
    for dag, _, _ in _cases():
        paths = [LongestPath(dag), LongestPath(dag, use_c=False)]
        for _ in range(20):
            durations = [rng.uniform(0.001, 0.05) for _ in range(dag.num_computations)]
            expected = longest_path_s(dag, durations)
            assert [path(durations) for path in paths] == [expected, expected]


def test_following_figures_are_evaluate_clocks_figures() -> None:
    """A followed point's refined time and energy: the effective plan as `evaluate_clocks` evaluates it."""
    dag, profile, model = _cases()[0]
    follower = PointFollower(dag, profile, 124.0, model)
    rng = random.Random(5)
    for _ in range(10):
        rows = tuple(tuple(_random_row(options, rng)) for options in follower.stages)
        start = follower.follow(_plan_stub(dag, profile, rows), rows, 0.0, 0.0, None)
        assert start.followed is not None
        clocks = [c for row in start.followed.effective_clocks_mhz for c in row]
        evaluation = evaluate_clocks(dag, profile, clocks, 124.0)
        assert (start.refined_time_s, start.refined_energy_j) == (evaluation.time_s, evaluation.energy_j)


def _plan_stub(dag: ComputationDag, profile: Profile, rows: tuple[tuple[int, ...], ...]) -> Plan:
    """A plan of `rows` (only its clocks matter to following)."""
    return Plan(PlanMeta.for_dag(dag, profile, 0.001, 124.0), 0, 0, 0.0, 0.0, 0.0, (), rows)


def test_the_c_core_refuses_bad_input() -> None:
    _c_core_or_skip()
    from perseusd.planner import _switchcore  # type: ignore[attr-defined]

    dag, profile, model = _cases()[1]
    stages = [StageOptions(dag, profile, s) for s in range(dag.num_stages)]
    core = switch_core(dag, stages, model)
    row = list(stages[0].top())
    with pytest.raises(IndexError):
        core.stage_cost(dag.num_stages, row)
    with pytest.raises(ValueError, match="computations"):
        core.stage_cost(0, row[:-1])
    with pytest.raises(KeyError, match="no measured clock 1"):
        core.stage_cost(0, [1, *row[1:]])
    with pytest.raises(TypeError):
        core.stage_cost(0, ["x", *row[1:]])
    pred_ptr, pred_idx, topo = dag_arrays(dag)
    with pytest.raises(ValueError, match="inconsistent"):
        _switchcore.Paths(pred_ptr, pred_idx, topo[:-1])
    broken = array("q", [*pred_idx[:-1], dag.num_computations])  # a predecessor that is no node
    with pytest.raises(ValueError, match="inconsistent"):
        _switchcore.Paths(pred_ptr, broken, topo)
    stages_ptr = stage_ptr_of(dag)
    paths = _switchcore.Paths(pred_ptr, pred_idx, topo)
    clocks, floats = [1500] * dag.num_computations, [0.01] * dag.num_computations
    with pytest.raises(ValueError, match="stage_ptr"):
        paths.held_waits(clocks, floats, floats, 1.0, 0.01)
    for uncovered in (stages_ptr[:-1], array("q", [0, *stages_ptr[2:]][:1])):
        with pytest.raises(ValueError, match="inconsistent"):
            _switchcore.Paths(pred_ptr, pred_idx, topo, stage_ptr=uncovered)
    paths = _switchcore.Paths(pred_ptr, pred_idx, topo, stage_ptr=stages_ptr)
    assert paths.held_waits(clocks, floats, floats, 1.0, 0.01) > 0.0
    with pytest.raises(ValueError, match="clocks, waits and times"):
        paths.held_waits(clocks[:-1], floats, floats, 1.0, 0.01)
    with pytest.raises(TypeError):
        paths.held_waits(clocks, ["x"] * len(floats), floats, 1.0, 0.01)
    with pytest.raises(ValueError, match="computations"):
        core.merged(0, row[:-1], 0.03)
    with pytest.raises(KeyError, match="no measured clock 1"):
        core.follow_row(0, [1] * len(row))
    one = array("d", [1.0])
    stage_ptr, opt_ptr, opt_clock = array("q", [0, 1]), array("q", [0, 1]), array("q", [1])
    with pytest.raises(ValueError, match="inconsistent"):
        _switchcore.Core(pred_ptr, pred_idx, topo, stage_ptr, opt_ptr, opt_clock, one, one, 0.0, 0.0)

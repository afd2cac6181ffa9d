"""The switch-aware descent per time limit: which limits are descended, from which starts, on which budget,
and which of a frontier's points a daemon may deploy.

`descend_frontier` runs `switch_search.DescentSearch` (the search itself) for each of `LIMIT_FACTORS` times
all-max's predicted time, slowest first, and appends each limit's best plan to the followed frontier when it
beats the least-energy deployable point there (docs/solver.md, "The switch-aware descent").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from perseusd.planner.dag import ComputationDag
from perseusd.planner.descent_trials import Descent, Rows
from perseusd.planner.evaluate import evaluate_clocks
from perseusd.planner.following import PointFollower
from perseusd.planner.plan import Frontier, Plan
from perseusd.planner.policy import TOLERANCE
from perseusd.planner.profile import Profile
from perseusd.planner.switch_search import DescentSearch
from perseusd.planner.switching import SwitchModel
from perseusd.planner.waiting import WaitingPower

LIMIT_FACTORS = (1.0, 1.05, 1.1, 1.2, 1.3)
"""The time limits the daemon descends for, as multiples of all-max's predicted time: the default
(no-slowdown) point's, and slower ones that slowdown targets and stragglers choose among."""
MAX_LATE_FRACTION = 0.10
"""A descent's plan has at most this share of computations begin before their clock is applied, as the model
counts them (`late_begins`); a start with more is repaired first. The closed loop holds the measured share
to 10 %; the model counts a little more than was measured on the simulated H100 (the daemon lowers early
where there is slack): 9.4 % modelled for 7.5 % and 8.3 % measured, 20 % for 16 %. Since `status` replies
no longer hold the daemon's loop, 20 closed-loop runs of 10 workloads measured 2.9-8.6 % for 4.7-9.7 %
modelled, each run at or under its plan's count."""
FOLLOWING_LOSS = 0.01
"""A point is descended from only when following it costs at least this share of its energy (or it begins
too many computations early). On h100x8 and h100x16 the descent beat nearly-as-solved points by 0.5-0.7 %
planned and measured 0.3-2 points less (runs of solver points: 15.4-17.1 %; of descended ones: 14.3, 16.0
and 16.6 %); where following costs more (lighthead: 8.1 % planned, 3.5 % followed) it gains."""
FAR_STEPS = (1, 2, 3, 5, 8, 13, 21, 34)
"""At the tightest limit, one more descent from the first start whose coarse moves reach this far. A filled
profile has a clock every 15 MHz (docs/profiling.md), where `NEAR_STEPS` move a run by at most 45 MHz: a
plan whose middle stages run 250 MHz lower than the start's takes dozens of moves that must each lower the
energy alone, and the descent keeps its start's allocation between stages. On an online
`dense-uneven-rc8x32` profile with the board's true costs at its clocks, 21.2 % saved with near moves,
23.5 % with far ones; alone they lost up to 1.0 points on `drawn-20261131`'s profiles, so both are descended
and the better plan kept (docs/solver.md, "Far moves")."""
MAX_NODE_EVALUATIONS = 4_000_000
"""Each descent's budget, in plan evaluations times the DAG's computations (~1 s of CPU per descent)."""
TIGHT_LIMIT_BUDGET = 16
"""Where the search is hard (`searches_harder`), each descent at the tightest limit (the no-slowdown plan's,
the one the daemon deploys by default) has this many times the budget. The budget is evaluations times
computations, so a long pipeline gets few evaluations: 11,000 at 7 stages x 26 microbatches, 7,800 at 8 x
32, where the descents ran out of it still finding less energy, and plans hung on their start
(docs/solver.md, "Far moves"). A small job's descents spend their budget for little: four times the budget
took the H100 4 x 16 planning step from 1.0 to 2.0 s for 0.005 points."""
FAR_BUDGET_SHARE = 2.0
"""`far_search_budget`: on a job shorter than `HARD_SEARCH_COMPUTATIONS`, of at least `FAR_SEARCH_STAGES`
stages, on GPUs with a slow lock, the far descent still runs at the tightest limit, on this many times a
descent's budget. On 19 online profiles of the 8 family workloads of 6 and 8 stages under 256 computations
(closed-loop runs, nine of `h200-layers8x8`), judged on the board's true costs: `h200-layers8x8`
21.61-24.31 % -> 23.92-24.75 % (2.70 -> 0.83 points apart; one profile 21.61 -> 23.98 %), one of four
`moe-uneven6x12` profiles +0.91 (the others the same plan), `h200-layers-rc6x12` +0.22, `dense-uneven-rc8x8`
+0.09, the other four the same plan; the solve at most 0.6 s longer (2.0 s at most). Half a budget left
that one profile at 21.81 %."""
FAR_SEARCH_STAGES = 6
"""`far_search_budget`: the shorter jobs that get the far descent have at least this many stages, where
middle stages have room to run far below their start. On the 7 four-stage family workloads' online
profiles the far descent (half or a whole budget) found the same plans, and the H100 4 x 16 planning step
took 0.85 s with a whole budget and 1.08-1.11 s with twice (over its 1 s bar) instead of 0.68-0.74 s."""
HARD_SEARCH_COMPUTATIONS = 256
"""`searches_harder`: jobs of at least this many computations an iteration (8 x 16, 6 x 22, 5 x 26)."""
HARD_SEARCH_LATENCY_S = 0.001
"""`searches_harder`: GPUs whose clock lock takes at least this long (an H100 or H200: 9-15 ms). Where it is
sub-millisecond (the simulated A100's 60 us), plans are followed nearly as solved and the descent's extra
time (A100 8 x 96: 10.7 -> 15.5 s with four times the budget) buys nothing."""


def descend_frontier(
    frontier: Frontier,
    dag: ComputationDag,
    profile: Profile,
    p_block_w: float,
    model: SwitchModel,
    all_max_time_s: float,
    factors: Sequence[float] = LIMIT_FACTORS,
    waiting: WaitingPower | None = None,
) -> Frontier:
    """A followed `frontier` (`follow_frontier`) with, per time limit (`all_max_time_s` x each factor), the
    descent's plan appended as a new point when it beats the least-energy deployable point (`deployable`)
    within that limit. A plan has at most `MAX_LATE_FRACTION` of its computations begin before their clock
    is applied.

    Without a waiting power, a limit is skipped when following cost that point under `FOLLOWING_LOSS` of its
    energy and it begins no more computations early than the cap: it runs nearly as the solver solved it.
    With one, every limit is descended: the solver judged its points' waits at the blocking power, the
    descent at the clocks held in them. The limits are descended slowest first, and each descent starts
    from that point's deployed clocks, from all-max and from the least-energy plan a slower limit's descent
    added (at the tightest limit from every one, `_slower_starts`; each brought within the limit,
    `DescentSearch._time_repair`), and keeps the best plan (at the
    tightest limit, the no-slowdown plan's, each descent's late begins reallocated first:
    `DescentSearch.reallocate`; at the slower ones not, for planning time); where no point
    is within the limit (the solver's fastest a few units of time slower than all-max), from the fastest
    point brought within it. Where the points within the limit switch too often to follow
    (h200-layers4x16's: 60 of 128 computations late) and no repair from them fits the budget, the slower
    limit's plan raised into it saved 24-26 % where all-max's descent saved 8-13 %. A new point's
    `followed`
    says `descended_from` (the start point's index); its `refined_*` figures are the descent's (the
    effective plan's energy, over the time that counts every lowering both ways: never less than the
    effective plan's figures). With a `waiting` power by held clock, the descent judges each wait at the clock
    held in it, and so do the figures of the points it adds."""
    follower = PointFollower(dag, profile, p_block_w, model, waiting)
    search = DescentSearch(follower)
    far_search: DescentSearch | None = None  # built at the tightest limit (`FAR_STEPS`)
    budget = max(1, MAX_NODE_EVALUATIONS // max(1, dag.num_computations))
    max_late = late_cap(dag.num_computations)
    points = list(frontier.points)
    descended: list[Plan] = []
    for factor in sorted(factors, reverse=True):
        limit_s = all_max_time_s * factor
        within = [p for p in points if p.predicted_time_s <= limit_s * (1 + TOLERANCE)]
        best = min(within, key=_energy_first, default=None)
        best_followable = min((p for p in within if within_late_cap(p)), key=_energy_first, default=None)
        worth = best is None or _worth_descending(best, best_followable is not best)
        if search.waiting is None and not worth:
            continue
        # no point within the limit: the solver's fastest, brought within it (`_time_repair`), and all-max
        first = best if best is not None else min(points, key=lambda p: p.predicted_time_s)
        tight = factor == min(factors)  # the no-slowdown plan's limit
        slower = _slower_starts(descended)
        starts = [first.clocks_mhz, search.all_max(), *slower[:1]]
        harder = tight and searches_harder(dag, model)
        limit_budget = budget * TIGHT_LIMIT_BUDGET if harder else budget
        found = [search.descend(start, limit_s, limit_budget, max_late) for start in starts]
        if tight:  # the other slower plans too, on a plain descent's budget (`_slower_starts`)
            found += [search.descend(start, limit_s, budget, max_late) for start in slower[1:]]
        descents = [d for d in found if d is not None]
        if tight:  # see `DescentSearch.reallocate`
            # starts whose descents met on one plan: that plan reallocated once
            seen = [d.clocks_mhz for d in descents]
            distinct = [d for k, d in enumerate(descents) if d.clocks_mhz not in seen[:k]]
            descents = [search.reallocate(d, limit_s, limit_budget, max_late) for d in distinct]
            far_budget = far_search_budget(dag, model, budget)
            if far_budget > 0:
                far_search = far_search or DescentSearch(follower, near_steps=FAR_STEPS)
                far = far_search.descend(starts[0], limit_s, far_budget, max_late)
                if far is not None:
                    descents.append(far_search.reallocate(far, limit_s, far_budget, max_late))
        if not descents:
            continue
        descent = min(descents, key=lambda d: d.energy_j)
        point = _descended_point(follower, first, descent, len(points), frontier.meta.unit_time_s)
        beaten = math.inf if best_followable is None else best_followable.refined_energy_j
        if point.refined_energy_j < beaten and point.predicted_time_s <= limit_s * (1 + TOLERANCE):
            points.append(point)
            descended.append(point)
    return replace(frontier, points=tuple(points))


def _slower_starts(descended: Sequence[Plan]) -> list[Rows]:
    """The distinct plans the slower limits' descents added, least energy first: every limit's descent also
    starts from the first (brought within the limit), the tightest limit's from every one, the others on a
    plain descent's budget. Which basin a repaired plan's descent ends in turns on small differences: on an
    online `dense-uneven-rc4x32` profile the no-slowdown plan from the least-energy one alone predicted
    5.72 % or 7.53 % at lock latencies 1 us apart, 3 of 17 latencies tried the lower; from every one,
    7.64-7.65 % at each."""
    starts: list[Rows] = []
    for plan in sorted(descended, key=_energy_first):
        if plan.clocks_mhz not in starts:
            starts.append(plan.clocks_mhz)
    return starts


def far_search_budget(dag: ComputationDag, model: SwitchModel, budget: int) -> int:
    """The far descent's budget at the tightest limit (`FAR_STEPS`), 0 for none: `TIGHT_LIMIT_BUDGET` times
    a descent's `budget` where the search is hard (`searches_harder`), `FAR_BUDGET_SHARE` times it on a
    shorter job of at least `FAR_SEARCH_STAGES` stages on GPUs whose lock takes at least
    `HARD_SEARCH_LATENCY_S`, none on a shorter pipeline or where the lock is sub-millisecond."""
    if searches_harder(dag, model):
        return budget * TIGHT_LIMIT_BUDGET
    if model.latency_s >= HARD_SEARCH_LATENCY_S and dag.num_stages >= FAR_SEARCH_STAGES:
        return max(1, int(budget * FAR_BUDGET_SHARE))
    return 0


def searches_harder(dag: ComputationDag, model: SwitchModel) -> bool:
    """Whether the no-slowdown plan's descents get `TIGHT_LIMIT_BUDGET` times the budget and the far descent
    (`FAR_STEPS`): a job of at least `HARD_SEARCH_COMPUTATIONS` computations on GPUs whose lock takes at
    least `HARD_SEARCH_LATENCY_S`."""
    return dag.num_computations >= HARD_SEARCH_COMPUTATIONS and model.latency_s >= HARD_SEARCH_LATENCY_S


def _energy_first(point: Plan) -> tuple[float, float]:
    return point.refined_energy_j, point.predicted_time_s


def late_cap(num_computations: int) -> int:
    """The most computations of an iteration a deployable plan may begin before their clock is applied."""
    return int(MAX_LATE_FRACTION * num_computations)


def within_late_cap(point: Plan) -> bool:
    """Whether `point` begins at most `MAX_LATE_FRACTION` of its computations before their clock is applied,
    as the switch model counts them (a point not followed, or without the count, is taken as within)."""
    late = None if point.followed is None else point.followed.late_begins
    return late is None or late <= late_cap(sum(len(row) for row in point.clocks_mhz))


def deployable(points: Sequence[Plan]) -> list[int]:
    """The positions of the points a daemon may deploy: those within the late cap (`within_late_cap`); every
    point when none is. A plan that lowers a GPU's clock for computations shorter than its lock latency is
    followed, by the model, at the higher clock for most of them: cheaper on paper than a plan that keeps
    them high, but the GPU then runs clocks its plan does not name, and the prediction with them. The
    descent (`descend_frontier`) adds a within-cap plan at every time limit it descends for; at all-max's
    time there is always one (all-max itself begins none late)."""
    within = [k for k, point in enumerate(points) if within_late_cap(point)]
    return within or list(range(len(points)))


def _worth_descending(point: Plan, over_late_cap: bool) -> bool:
    """Whether following lost `point` at least `FOLLOWING_LOSS` of its energy, or it (the least-energy point
    within the limit) begins more computations early than the cap: else the solver's plan runs nearly as
    solved, and the descent's few tenths of a percent are within what the descent does not count (the idle
    power of the clock held in a bubble, which only `refined_energy_j` counts, the time between stages),
    which on the shipped H100 profile favoured the solver's points in the closed loop."""
    followed = point.followed
    if followed is None:
        return False
    return over_late_cap or point.refined_energy_j > followed.planned_energy_j * (1 + FOLLOWING_LOSS)


def _descended_point(
    follower: PointFollower, start: Plan, descent: Descent, index: int, unit_time_s: float
) -> Plan:
    """The descent's plan as a frontier point numbered `index` (its solver fields: the plan's own figures with
    instant switches; `followed`: its effective plan)."""
    node_clocks = [clock for row in descent.clocks_mhz for clock in row]
    planned = evaluate_clocks(follower.dag, follower.profile, node_clocks, follower.p_block_w)
    solved = start.followed.solved_clocks_mhz if start.followed is not None else None
    numbered = replace(
        start,
        index=index,
        quant_time=max(0, round(planned.time_s / unit_time_s)) if unit_time_s > 0 else start.quant_time,
        time_s=planned.time_s,
        model_energy_j=planned.energy_j,
    )
    followed = follower.follow(
        numbered,
        descent.clocks_mhz,
        planned.time_s,
        planned.energy_j,
        solved if solved is not None else start.clocks_mhz,
        descended_from=start.index,
    )
    # The descent's own figures: its time counts a lowering both ways, so a policy choosing on it never
    # counts on a lowering that acts late; its waits are at the clocks held when it has a waiting power.
    return replace(followed, refined_time_s=descent.time_s, refined_energy_j=descent.energy_j)

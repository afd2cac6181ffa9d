"""The switch-aware descent: plans searched on what the GPUs will really run, not on what the solver assumes.

The solver's points are optimal when clock changes are instant. With a ~10 ms lock they are not followed as
solved (`switching`): short lowered runs are merged up (their saving is lost) and the chosen point keeps only
part of the solver's saving (an H100 job with a light last stage: 3.5 % of 8.1 %). The descent looks for a
better plan directly on the switch model. From a start (a followed frontier point, else all-max) it applies,
while it lowers the energy, the best move: one stage's cyclic segment of computations (in schedule order)
set to one clock (each computation at its lowest measured clock at or above it). A plan is judged as it will
really run, conservatively:

- energy: every computation at its effective clock (`followable_stage_clocks`), plus the blocking power
  while a GPU waits inside the iteration, or, with a waiting power by held clock (`WaitingPower`), each wait
  at the clock held in it (`waiting.held_waits_j`): a plan may slow a GPU whose waits then cost less, or
  keep a lower clock through a wait;
- time: the longest path with every computation at the slower of its planned and effective clocks. A
  lowering that acts late leaves a computation at the higher clock only when the GPU goes straight on; after
  a wait (a pipeline bubble) the lower clock is already in force. The descent never counts on the late one.

A move is taken only when the plan's time stays within the limit and at most a cap of the computations
(`descent_limits.MAX_LATE_FRACTION`) begin before their clock is applied. In order: a start over that cap
is repaired by merging runs (`_merge_repair`), then coarse moves (`_run_moves`: whole runs to nearby
clocks, runs grown into their neighbours, segments with ends on a grid of 2, then 4 points a stage), then
the segment moves above run while the budget lasts (on a stage of 48 computations one scan of them is three
budgets). A start over the time limit is first brought within it by raising clocks (`_time_repair`). The
descent is deterministic (moves are tried in a fixed order, ties keep the first) and bounded by a number of
evaluations. Which limits are descended, from which starts and on which budget: `descent_limits`.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perseusd.planner.following import PointFollower
from perseusd.planner.policy import TOLERANCE
from perseusd.planner.switch_core import Found, ScanLimits, StageCost, switch_core
from perseusd.planner.switching import late_begins, runs_of

Rows = tuple[tuple[int, ...], ...]
"""Clocks per stage, in schedule order."""


@dataclass(frozen=True)
class Descent:
    """The plan a descent found."""

    clocks_mhz: Rows
    """Per stage, in schedule order: the clocks to deploy."""
    time_s: float
    """The conservative iteration time (see the module's docstring)."""
    energy_j: float
    evaluations: int
    moves: int


_Kept = dict[int, tuple[tuple[int, ...], list[tuple[int, ...]]]]
"""Per stage, its row and the trials built for it (`_kept_trials`): rebuilt only when the row changes."""


def _kept_trials(
    kept: _Kept,
    stage: int,
    row: tuple[int, ...],
    build: Callable[[int, tuple[int, ...]], list[tuple[int, ...]]],
) -> list[tuple[int, ...]]:
    """The stage's trials for `row`, built by `build(stage, row)` only when its row changed."""
    if kept.get(stage, ((),))[0] != row:
        kept[stage] = (row, build(stage, row))
    return kept[stage][1]


@dataclass
class _State:
    """A descent in progress: the plan, its stages' costs and figures, and what it has spent."""

    rows: list[tuple[int, ...]]
    costs: list[StageCost]
    time_s: float = 0.0
    energy_j: float = 0.0
    evaluations: int = 0
    moves: int = 0
    late_price_j: float = 0.0
    """Moves are judged by the plan's energy plus this much per late begin (`DescentSearch.descend`)."""

    def late(self) -> int:
        return sum(cost[2] for cost in self.costs)

    def key_j(self) -> float:
        """What a move must beat: the plan's energy, plus its late begins' price."""
        return self.energy_j + self.late_price_j * self.late()

    def apply(
        self, energy_j: float, time_s: float, stage: int, row: tuple[int, ...], cost: StageCost
    ) -> None:
        self.energy_j, self.time_s, self.rows[stage], self.costs[stage] = energy_j, time_s, row, cost
        self.moves += 1


class DescentSearch:
    """Descents on one job's DAG and profile under one switch model.

    A stage's trial rows are judged by `switch_core` (in C where it was built, the same figures as its
    Python specification); one descent runs at a time on a search."""

    def __init__(
        self, follower: PointFollower, use_c: bool = True, near_steps: Sequence[int] | None = None
    ) -> None:
        """Descents on `follower`'s job, model and stage options (its `waiting` power too), whose coarse
        moves set a run to the clocks `near_steps` (default `NEAR_STEPS`) of its stage's clocks from its
        own, either way."""
        self.follower = follower
        self.near_steps = tuple(NEAR_STEPS if near_steps is None else near_steps)
        self.dag, self.p_block_w, self.model = follower.dag, follower.p_block_w, follower.model
        self.stages = follower.stages
        self.waiting = follower.waiting
        self.core = switch_core(self.dag, self.stages, self.model, use_c, self.waiting)

    def all_max(self) -> Rows:
        """Every computation at its highest measured clock."""
        return tuple(costs.top() for costs in self.stages)

    def evaluate(self, rows: Sequence[Sequence[int]]) -> tuple[float, float]:
        """A plan's conservative (time, energy)."""
        costs = self._set(rows)
        time_s = self.core.trial_time(0)
        return time_s, self._energy(costs, time_s)

    def late(self, rows: Sequence[Sequence[int]]) -> int:
        """How many of a plan's computations begin before their clock is applied (`late_begins`)."""
        return sum(late_begins(list(row), self.stages[s].time_at, self.model) for s, row in enumerate(rows))

    def descend(
        self,
        start: Sequence[Sequence[int]],
        limit_s: float,
        max_evaluations: int,
        max_late: int | None = None,
        late_price_j: float = 0.0,
    ) -> Descent | None:
        """The plan the descent reaches from `start` within `limit_s`, with at most `max_late` computations
        that begin before their clock is applied (`late_begins`; None: any number). A start with more is
        first repaired: moves that lower that count, the least energy first, until it is within the cap.
        None when `start` cannot be brought within the time limit (`_time_repair`), or its late begins
        cannot be repaired within the budget."""
        state = _State([tuple(row) for row in start], self._set(start), late_price_j=late_price_j)
        state.time_s = self.core.trial_time(0)
        state.energy_j = self._energy(state.costs, state.time_s)
        limit_s *= 1 + TOLERANCE
        if state.time_s > limit_s and not self._time_repair(state, limit_s, max_evaluations):
            return None
        allowed = self.dag.num_computations if max_late is None else max_late
        self._merge_repair(state, limit_s, allowed)
        if state.late() <= allowed:
            self._run_moves(state, limit_s, allowed, max_evaluations)
        while state.evaluations < max_evaluations:
            repairing = state.late() > allowed
            move = self._best_move(state, limit_s, allowed, repairing, max_evaluations)
            if move is None:
                break
            state.apply(*move)
            self.core.stage_cost(move[2], move[3])
            self.core.accept(move[2])
        if state.late() > allowed:
            return None
        rows = tuple(state.rows)
        return Descent(rows, state.time_s, state.energy_j, state.evaluations, state.moves)

    def reallocate(self, found: Descent, limit_s: float, max_evaluations: int, max_late: int) -> Descent:
        """`found`, or a plan of less energy that spends the late begins elsewhere, where `found` begins
        `max_late` computations late (the cap binds). A descent spends the cap on its first moves, the best
        ones for the plan as it was then; a stage that would save more with a few late begins later finds
        none left (docs/solver.md, "Reallocation"). Two ways out, each descended with `max_evaluations`,
        the best plan kept:

        - priced: the plan descended with no cap, each late begin priced at `LATE_PRICE` times the plan's
          energy per computation, then descended within the cap: stages trade their late begins for what
          each saves, not for who came first (an online dense8x8 profile: six stages lowered with two late
          begins each and the seventh left at its highest clock, 17.1 % on the board's costs; priced, two
          stages keep one each and all seven are lowered, 18.9 %);
        - released: each stage that holds late begins, in order, set back to its highest clocks (none late)
          and the plan descended again from there."""
        if self.late(found.clocks_mhz) < max_late:
            return found
        best = found
        price_j = LATE_PRICE * found.energy_j / max(1, self.dag.num_computations)
        priced = self.descend(found.clocks_mhz, limit_s, max_evaluations, None, late_price_j=price_j)
        if priced is not None:
            capped = self.descend(priced.clocks_mhz, limit_s, max_evaluations, max_late)
            if capped is not None and capped.energy_j < best.energy_j:
                best = capped
        for stage, row in enumerate(found.clocks_mhz):
            if late_begins(list(row), self.stages[stage].time_at, self.model) == 0:
                continue
            rows = list(best.clocks_mhz)
            rows[stage] = self.stages[stage].top()
            descent = self.descend(rows, limit_s, max_evaluations, max_late)
            if descent is not None and descent.energy_j < best.energy_j:
                best = descent
        return best

    def _time_repair(self, state: _State, limit_s: float, max_evaluations: int) -> bool:
        """Bring a start over `limit_s` within it: clock by clock (`_step_repair`, a quarter of the budget),
        else every computation raised by the same MHz, the least that does (`_raise_all`). A start a few
        units over (the solver's rounding) takes a few steps; one 5 % over (a slower limit's plan) takes
        hundreds at clocks 15 MHz apart, more than the budget. False when neither brings it within."""
        if self._step_repair(state, limit_s, max(1, max_evaluations // 4)):
            return True
        return self._raise_all(state, limit_s)

    def _raise_all(self, state: _State, limit_s: float) -> bool:
        """Raise every computation by the least number of MHz (each snapped up to a measured clock, at most
        its highest) that brings the plan within `limit_s`, found by bisection; False when all-highest is
        over it too (the plan is left as it was)."""

        def raised(delta_mhz: int) -> list[tuple[int, ...]]:
            return [
                tuple(
                    self.stages[stage].snap_up(i, min(c + delta_mhz, self.stages[stage].clocks_mhz[i][-1]))
                    for i, c in enumerate(row)
                )
                for stage, row in enumerate(state.rows)
            ]

        def within(delta_mhz: int) -> bool:
            state.evaluations += 1
            self._set(raised(delta_mhz))
            return self.core.trial_time(0) <= limit_s

        low, high = 0, max(c[-1] for options in self.stages for c in options.clocks_mhz)
        if not within(high):
            self._set(state.rows)
            return False
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if within(middle) else (middle, high)
        state.rows = raised(high)
        state.costs = self._set(state.rows)
        state.time_s = self.core.trial_time(0)
        state.energy_j = self._energy(state.costs, state.time_s)
        return True

    def _step_repair(self, state: _State, limit_s: float, max_evaluations: int) -> bool:
        """Bring a start over `limit_s` within it: while it is over, raise the run of one stage, or one
        computation, to its next higher clock, whichever shortens the plan for the least energy per second
        (the solver rounds each computation's time down to its unit, so its fastest point can end a few
        units after all-max: on an online profile with clocks 15 MHz apart, 0.18 %). False when no raise
        shortens the plan or the budget runs out first."""
        while state.time_s > limit_s:
            best: tuple[float, float, float, int, tuple[int, ...]] | None = None
            for stage, row in enumerate(state.rows):
                for trial in self._raises(stage, row):
                    if state.evaluations >= max_evaluations:
                        return False
                    state.evaluations += 1
                    energy_j, time_s, _cost = self._trial(state, stage, trial)
                    if time_s >= state.time_s - 1e-12:
                        continue
                    per_s = (energy_j - state.energy_j) / (state.time_s - time_s)
                    if best is None or per_s < best[0]:
                        best = (per_s, energy_j, time_s, stage, trial)
            if best is None:
                return False
            _per_s, energy_j, time_s, stage, trial = best
            self._take(state, energy_j, time_s, stage, trial)
        return True

    def _raises(self, stage: int, row: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Each run of `row`, and each computation below its highest clock, at its next higher clock."""
        trials: dict[tuple[int, ...], None] = {}
        options = self.stages[stage]
        for run in runs_of(row):
            self._add_trial(trials, row, stage, run, row[run[0]] + 1)
        for i, clock_mhz in enumerate(row):
            if clock_mhz < options.clocks_mhz[i][-1]:
                self._add_trial(trials, row, stage, [i], clock_mhz + 1)
        return list(trials)

    def _merge_repair(self, state: _State, limit_s: float, allowed: int) -> None:
        """While the plan begins more than `allowed` computations late, merge the run of one stage whose
        merge costs the least energy per late begin it removes into a neighbouring run (the run set to that
        run's clock), within `limit_s`. A run shorter than the lock latency is what begins late; the
        segment moves of `_best_move` reach the same plans, but one scan of every segment at every clock
        can outlast the budget on a profile with many clocks. Not bounded by the budget (its trials count in
        `evaluations`): each round removes a late begin or ends the repair, and costs two trials a run.

        Lazily: each stage's best merge is kept as last judged, and a round judges again only the stage whose
        row changed and the stage whose kept merge it is about to take (whose merges' figures moved with the
        rest of the plan); it takes that merge when it is still no worse than every other stage's kept one.
        A stage's merges are judged by the core (`judge_rows`), built once per row. Every stage is judged
        again before the repair gives up."""
        kept: _Kept = {}
        best_of: dict[int, tuple[float, Found] | None] = {}
        stale = set(range(len(state.rows)))
        while state.late() > allowed:
            choice = self._lazy_best_merge(state, limit_s, allowed, kept, best_of, stale)
            if choice is None:
                return
            stage, found = choice
            self._accept(state, stage, found)
            stale = {stage}

    def _lazy_best_merge(
        self,
        state: _State,
        limit_s: float,
        allowed: int,
        kept: _Kept,
        best_of: dict[int, tuple[float, Found] | None],
        stale: set[int],
    ) -> tuple[int, Found] | None:
        """The merge `_merge_repair` takes this round: stages in `stale` judged anew, then the least kept
        merge judged anew until it is one judged on the plan as it is now."""
        fresh: set[int] = set()

        def judge(stage: int) -> None:
            best_of[stage] = self._best_merge(state, stage, limit_s, allowed, kept)
            fresh.add(stage)

        for stage in sorted(stale):
            judge(stage)
        while True:
            merges = ((merge[0], stage, merge[1]) for stage, merge in best_of.items() if merge is not None)
            least = min(merges, default=None)
            if least is None:
                unjudged = [stage for stage in best_of if stage not in fresh]
                if not unjudged:
                    return None
                for stage in unjudged:
                    judge(stage)
            elif least[1] in fresh:
                return least[1], least[2]
            else:
                judge(least[1])

    def _best_merge(
        self,
        state: _State,
        stage: int,
        limit_s: float,
        allowed: int,
        kept: _Kept,
    ) -> tuple[float, Found] | None:
        """The stage's merge of least energy per late begin removed, within `limit_s`, and that figure."""
        late = state.late()
        merges = _kept_trials(kept, stage, state.rows[stage], self._merges)
        limits = self._limits(state, stage, late, allowed, limit_s, math.inf, sys.maxsize)
        used, _, found = self.core.judge_rows(stage, merges, state.energy_j, *limits.args())
        state.evaluations += used
        if found is None:
            return None
        return (found[0] - state.energy_j) / (late - (limits.late_others + found[3][2])), found

    def _run_moves(self, state: _State, limit_s: float, allowed: int, max_evaluations: int) -> None:
        """While it lowers the energy within `limit_s` and `allowed` late begins, apply the best of the coarse
        moves (`_coarse_trials`): first with segments on a grid of `GRID_LEVELS[0]` points per stage, then
        on each finer grid. A round costs a few hundred trials a stage where the segment moves cost
        computations squared x clocks (46,000 a stage at 6x24, three times the budget of a descent there:
        its scan, in clock order from the lowest, then judged only the lowest clocks of the first stage)."""
        for grid in GRID_LEVELS:
            self._coarse_moves(state, limit_s, allowed, max_evaluations, grid)

    def _coarse_moves(
        self, state: _State, limit_s: float, allowed: int, max_evaluations: int, grid: int
    ) -> None:
        """`_run_moves` on one grid: best-move rounds until none lowers the energy or the budget is spent. A
        stage's trials are kept while its row is unchanged; the core judges them (`judge_rows`)."""
        kept: _Kept = {}
        while state.evaluations < max_evaluations:
            late = state.late()
            best: tuple[Found, int, float] | None = None
            for stage, row in enumerate(state.rows):
                trials = _kept_trials(kept, stage, row, lambda s, r: self._coarse_trials(s, r, grid))
                bound = state.key_j() if best is None else best[2]
                remaining = max_evaluations - state.evaluations
                limits = self._limits(state, stage, late, allowed, limit_s, bound, remaining)
                used, exhausted, found = self.core.judge_rows(stage, trials, None, *limits.args())
                state.evaluations += used
                if found is not None:
                    best = (found, stage, found[0] + state.late_price_j * (limits.late_others + found[3][2]))
                if exhausted:
                    break
            if best is None:
                return
            self._accept(state, best[1], best[0])

    def _coarse_trials(self, stage: int, row: tuple[int, ...], grid: int) -> list[tuple[int, ...]]:
        """One stage's coarse moves: each run of `row` at the clocks near its own (`near_steps` steps of the
        stage's clocks either way), each run grown by 1, 2, 4 and 8 computations at either end (its
        neighbour shrunk), and each cyclic segment whose ends lie on a grid of `grid` points at the clocks
        near its highest (each computation snapped up to a measured clock)."""
        trials: dict[tuple[int, ...], None] = {}
        n, runs = len(row), runs_of(row)
        for run in runs:
            for clock_mhz in self._near_clocks(stage, row[run[0]]):
                self._add_trial(trials, row, stage, run, clock_mhz)
        for run in runs if len(runs) > 1 else ():
            for grown in (1, 2, 4, 8):
                if grown >= n - len(run):
                    break
                for end, step in ((run[0], -1), (run[-1], 1)):
                    group = [(end + step * j) % n for j in range(1, grown + 1)]
                    self._add_trial(trials, row, stage, group, row[run[0]])
        spacing = max(1, -(-n // grid))
        for first in range(0, n, spacing):
            for length in range(spacing, n, spacing):
                segment = [(first + j) % n for j in range(length)]
                for clock_mhz in self._near_clocks(stage, max(row[i] for i in segment)):
                    self._add_trial(trials, row, stage, segment, clock_mhz)
        return list(trials)

    def _near_clocks(self, stage: int, clock_mhz: int) -> tuple[int, ...]:
        """The stage's clocks `near_steps` steps of its clocks from `clock_mhz` either way, and `clock_mhz`'s
        own, ascending."""
        clocks = self.stages[stage].all_clocks_mhz
        at = bisect.bisect_left(clocks, clock_mhz)
        offsets = sorted({0, *self.near_steps, *(-step for step in self.near_steps)})
        return tuple(clocks[at + k] for k in offsets if 0 <= at + k < len(clocks))

    def _merges(self, stage: int, row: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Each run of `row` set to the clock of the run before it and of the run after it (each
        computation at its lowest measured clock at or above it); where a computation of the run has no
        such clock (a profile that visited other clocks for another instruction), the run and that
        neighbour both at the higher clock it snapped to; and the run with both neighbours at the highest of
        their clocks (where merging into one neighbour only moves a late begin to the other boundary)."""
        runs = runs_of(row)
        options = self.stages[stage]
        trials: dict[tuple[int, ...], None] = {}
        for k, run in enumerate(runs if len(runs) > 1 else ()):
            before, after = runs[k - 1], runs[(k + 1) % len(runs)]
            for neighbour in (before, after):
                clock_mhz = row[neighbour[0]]
                snapped = max(options.snap_up(i, clock_mhz) for i in run)
                group = run if snapped == clock_mhz else run + neighbour
                self._add_trial(trials, row, stage, group, snapped)
            # the run and both neighbours at the highest of their clocks: both of its boundaries go
            both = before + run + after if before is not after else run + before
            self._add_trial(trials, row, stage, both, max(row[i] for i in both))
        return list(trials)

    def _add_trial(
        self,
        trials: dict[tuple[int, ...], None],
        row: tuple[int, ...],
        stage: int,
        group: list[int],
        mhz: int,
    ) -> None:
        """`row` with `group` at `mhz` (each computation snapped up), added to `trials` (kept in the order
        added) when it is new and not `row` itself."""
        options = self.stages[stage]
        trial = list(row)
        for i in group:
            trial[i] = options.snap_up(i, mhz)
        key = tuple(trial)
        if key != row:
            trials.setdefault(key)

    def _take(self, state: _State, energy_j: float, time_s: float, stage: int, row: tuple[int, ...]) -> None:
        """Apply a judged trial: `row` becomes the stage's, in the state and in the core."""
        state.apply(energy_j, time_s, stage, row, self.core.stage_cost(stage, list(row)))
        self.core.accept(stage)

    def _accept(self, state: _State, stage: int, found: Found) -> None:
        """Apply a move the core found (`scan`, `judge_rows`) for the stage."""
        energy_j, time_s, row, cost = found
        state.apply(energy_j, time_s, stage, row, cost)
        self.core.stage_cost(stage, list(row))
        self.core.accept(stage)

    def _trial(self, state: _State, stage: int, row: tuple[int, ...]) -> tuple[float, float, StageCost]:
        """(energy, time, the stage's cost) of the plan with `row` in place of the stage's."""
        cost = self.core.stage_cost(stage, list(row))
        time_s = self.core.trial_time(stage)
        costs = [*state.costs[:stage], cost, *state.costs[stage + 1 :]]
        if self.waiting is not None:
            return sum(c[0] for c in costs) + self.core.trial_waits(stage, time_s), time_s, cost
        busy_s = sum(c[1] for c in costs)
        waiting_j = self.p_block_w * (self.dag.num_stages * time_s - busy_s)
        return sum(c[0] for c in costs) + waiting_j, time_s, cost

    def _limits(
        self,
        state: _State,
        stage: int,
        late: int,
        allowed: int,
        limit_s: float,
        bound_j: float,
        remaining: int,
        repairing: bool = False,
    ) -> ScanLimits:
        """What the core judges the stage's trials against (`ScanLimits`), the plan being `state`."""
        before, after = state.costs[:stage], state.costs[stage + 1 :]
        return ScanLimits(
            late,
            late - state.costs[stage][2],
            allowed,
            repairing,
            limit_s,
            bound_j,
            sum(c[0] for c in before),
            sum(c[1] for c in before),
            tuple((c[0], c[1]) for c in after),
            self.p_block_w,
            self.dag.num_stages,
            remaining,
            state.late_price_j,
        )

    def _set(self, rows: Sequence[Sequence[int]]) -> list[StageCost]:
        """Every stage's cost of `rows`, which become the core's current durations."""
        costs = []
        for stage, row in enumerate(rows):
            costs.append(self.core.stage_cost(stage, list(row)))
            self.core.accept(stage)
        return costs

    def _best_move(
        self, state: _State, limit_s: float, allowed: int, repairing: bool, max_evaluations: int
    ) -> tuple[float, float, int, tuple[int, ...], StageCost] | None:
        """The move of least energy within the time limit that lowers the late count (`repairing`) or, with
        at most `allowed` late, the energy; None when there is none (or the budget ran out first).

        Each stage's moves are scanned by the core (`SwitchCore.scan`); a trial's figures are `_energy`'s,
        the same sums in the same order."""
        late = state.late()
        best: tuple[float, float, int, tuple[int, ...], StageCost] | None = None
        best_key = math.inf
        for stage, row in enumerate(state.rows):
            bound = best_key if best else (math.inf if repairing else state.key_j())
            remaining = max_evaluations - state.evaluations
            limits = self._limits(state, stage, late, allowed, limit_s, bound, remaining, repairing)
            used, exhausted, found = self.core.scan(stage, row, *limits.args())
            state.evaluations += used
            if found is not None:
                best = (found[0], found[1], stage, found[2], found[3])
                best_key = found[0] + state.late_price_j * (limits.late_others + found[3][2])
            if exhausted:
                return best
        return best

    def _energy(self, costs: Sequence[StageCost], time_s: float) -> float:
        """The plan's energy at iteration time `time_s` (the core's current durations): its stages' plus
        blocking power while waiting, or its waits at the clocks held (`SwitchCore.trial_waits`)."""
        if self.waiting is not None:
            return sum(cost[0] for cost in costs) + self.core.trial_waits(0, time_s)
        busy_s = sum(cost[1] for cost in costs)
        waiting_j = self.p_block_w * (self.dag.num_stages * time_s - busy_s)
        return sum(cost[0] for cost in costs) + waiting_j


LATE_PRICE = 1.0
"""A priced descent (`DescentSearch.reallocate`) charges each late begin this many times the plan's energy per
computation. On 60 family online profiles, 1.0 alone raised 12 plans' savings on the board's costs (by up to
1.9 points) and lowered none; 0.5 and 2.0 beside it found nothing more on dense8x8's six."""
GRID_LEVELS = (2, 4)
"""The coarse moves' grids (`DescentSearch._run_moves`): segments with ends on 2, then 4 points a stage.
Offline on 10 family workloads' online profiles (2 seeds, lock latencies 12 and 13 ms, judged on the
board's true costs) the plans saved 0.63 points more on average than with whole runs at every clock (at
most 0.29 less on any), and dense-uneven-rc6x24's 12 and 13 ms plans came 0.6 points apart instead of 4.3
(20.8 and 16.5 %; now 21.1 and 20.5 %). A third grid of 8 points gave the same plans on the six profiles
tried and a third more planning time (H100 4x16: 1.36 s, 1.03 s without it, 0.82 s before the coarse
moves)."""
NEAR_STEPS = (1, 2, 3)
"""A coarse move sets its computations to a clock this many of the stage's clocks from the highest clock
among them, up or down."""

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

`DescentSearch` puts its parts together: a plan's figures and one trial judged and applied on the core
(`descent_trials`), the repairs of a start (`descent_repairs`: `_time_repair`, `_merge_repair`) and the
coarse moves (`coarse_moves`: `_run_moves`); here the descent itself, its segment moves (`_best_move`) and
the reallocation of late begins (`DescentSearch.reallocate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perseusd.planner.coarse_moves import NEAR_STEPS, CoarseMoves
from perseusd.planner.descent_repairs import DescentRepairs
from perseusd.planner.descent_trials import Descent, DescentState
from perseusd.planner.following import PointFollower
from perseusd.planner.policy import TOLERANCE
from perseusd.planner.switch_core import StageCost
from perseusd.planner.switching import late_begins


class DescentSearch(CoarseMoves, DescentRepairs):
    """Descents on one job's DAG and profile under one switch model.

    A stage's trial rows are judged by `switch_core` (in C where it was built, the same figures as its
    Python specification); one descent runs at a time on a search. The trials and a plan's figures:
    `descent_trials.DescentTrials`; the repairs of a start: `descent_repairs.DescentRepairs`; the coarse
    moves: `coarse_moves.CoarseMoves`; here the descent itself and its segment moves."""

    def __init__(
        self, follower: PointFollower, use_c: bool = True, near_steps: Sequence[int] | None = None
    ) -> None:
        """Descents on `follower`'s job, model and stage options (its `waiting` power too), whose coarse
        moves set a run to the clocks `near_steps` (default `NEAR_STEPS`) of its stage's clocks from its
        own, either way."""
        super().__init__(follower, use_c)
        self.near_steps = tuple(NEAR_STEPS if near_steps is None else near_steps)

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
        state = DescentState([tuple(row) for row in start], self._set(start), late_price_j=late_price_j)
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

    def _best_move(
        self, state: DescentState, limit_s: float, allowed: int, repairing: bool, max_evaluations: int
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


LATE_PRICE = 1.0
"""A priced descent (`DescentSearch.reallocate`) charges each late begin this many times the plan's energy per
computation. On 60 family online profiles, 1.0 alone raised 12 plans' savings on the board's costs (by up to
1.9 points) and lowered none; 0.5 and 2.0 beside it found nothing more on dense8x8's six."""

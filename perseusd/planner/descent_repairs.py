"""The descent's repairs: a start brought within the time limit, and its late begins within the cap.

`DescentRepairs` is the part of `switch_search.DescentSearch` that repairs a start before the moves begin
(docs/solver.md, "The switch-aware descent"): a start over the time limit raised clock by clock
(`_step_repair`), else every computation by the same MHz (`_raise_all`); a start that begins more than the
cap of its computations before their clock is applied has runs merged into their neighbours
(`_merge_repair`), lazily, each stage's merges judged by the core (`judge_rows`). Trials are built and
judged by `descent_trials.DescentTrials`.
"""

from __future__ import annotations

import math
import sys

from perseusd.planner.descent_trials import DescentState, DescentTrials, KeptTrials, kept_trials
from perseusd.planner.switch_core import Found
from perseusd.planner.switching import runs_of


class DescentRepairs(DescentTrials):
    """A descent's repairs of its start: within the time limit (`_time_repair`), within the late cap
    (`_merge_repair`)."""

    def _time_repair(self, state: DescentState, limit_s: float, max_evaluations: int) -> bool:
        """Bring a start over `limit_s` within it: clock by clock (`_step_repair`, a quarter of the budget),
        else every computation raised by the same MHz, the least that does (`_raise_all`). A start a few
        units over (the solver's rounding) takes a few steps; one 5 % over (a slower limit's plan) takes
        hundreds at clocks 15 MHz apart, more than the budget. False when neither brings it within."""
        if self._step_repair(state, limit_s, max(1, max_evaluations // 4)):
            return True
        return self._raise_all(state, limit_s)

    def _raise_all(self, state: DescentState, limit_s: float) -> bool:
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

    def _step_repair(self, state: DescentState, limit_s: float, max_evaluations: int) -> bool:
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

    def _merge_repair(self, state: DescentState, limit_s: float, allowed: int) -> None:
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
        kept: KeptTrials = {}
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
        state: DescentState,
        limit_s: float,
        allowed: int,
        kept: KeptTrials,
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
        state: DescentState,
        stage: int,
        limit_s: float,
        allowed: int,
        kept: KeptTrials,
    ) -> tuple[float, Found] | None:
        """The stage's merge of least energy per late begin removed, within `limit_s`, and that figure."""
        late = state.late()
        merges = kept_trials(kept, stage, state.rows[stage], self._merges)
        limits = self._limits(state, stage, late, allowed, limit_s, math.inf, sys.maxsize)
        used, _, found = self.core.judge_rows(stage, merges, state.energy_j, *limits.args())
        state.evaluations += used
        if found is None:
            return None
        return (found[0] - state.energy_j) / (late - (limits.late_others + found[3][2])), found

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

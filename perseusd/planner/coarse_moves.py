"""The descent's coarse moves: whole runs to nearby clocks, runs grown into their neighbours, and segments
with ends on a grid of points a stage.

`CoarseMoves` is the part of `switch_search.DescentSearch` that, once a start is within its limits, applies
the best coarse move while it lowers the energy (`_run_moves`), first on a grid of `GRID_LEVELS[0]` points a
stage, then on each finer one, before the segment moves (`DescentSearch._best_move`) spend what is left of
the budget. A run moves to the clocks `near_steps` (default `NEAR_STEPS`; `descent_limits.FAR_STEPS` for
the far descent) of its stage's clocks from its own. Trials are built and judged by
`descent_trials.DescentTrials`.
"""

from __future__ import annotations

import bisect

from perseusd.planner.descent_trials import DescentState, DescentTrials, KeptTrials, kept_trials
from perseusd.planner.switch_core import Found
from perseusd.planner.switching import runs_of

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


class CoarseMoves(DescentTrials):
    """A descent's coarse moves (`_run_moves`), on the grids of `GRID_LEVELS`."""

    near_steps: tuple[int, ...]
    """How many of its stage's clocks a coarse move sets a run from its own, either way (`NEAR_STEPS`)."""

    def _run_moves(self, state: DescentState, limit_s: float, allowed: int, max_evaluations: int) -> None:
        """While it lowers the energy within `limit_s` and `allowed` late begins, apply the best of the coarse
        moves (`_coarse_trials`): first with segments on a grid of `GRID_LEVELS[0]` points per stage, then
        on each finer grid. A round costs a few hundred trials a stage where the segment moves cost
        computations squared x clocks (46,000 a stage at 6x24, three times the budget of a descent there:
        its scan, in clock order from the lowest, then judged only the lowest clocks of the first stage)."""
        for grid in GRID_LEVELS:
            self._coarse_moves(state, limit_s, allowed, max_evaluations, grid)

    def _coarse_moves(
        self, state: DescentState, limit_s: float, allowed: int, max_evaluations: int, grid: int
    ) -> None:
        """`_run_moves` on one grid: best-move rounds until none lowers the energy or the budget is spent. A
        stage's trials are kept while its row is unchanged; the core judges them (`judge_rows`)."""
        kept: KeptTrials = {}
        while state.evaluations < max_evaluations:
            late = state.late()
            best: tuple[Found, int, float] | None = None
            for stage, row in enumerate(state.rows):
                trials = kept_trials(kept, stage, row, lambda s, r: self._coarse_trials(s, r, grid))
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

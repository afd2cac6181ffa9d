"""A descent's plan in progress, and how one stage's trial row is judged and applied on the switch core.

`DescentTrials` is the part of `switch_search.DescentSearch` (the search) that holds one job's DAG, profile
and switch model, the switch core that judges a stage's trial rows (`switch_core`, in C where it was built),
and the steps every move goes through: a plan's figures (`evaluate`, `late`), one trial's (`_trial`), the
limits the core judges a stage's trials against (`_limits`), a trial row built (`_add_trial`) and a move
applied (`_take`, `_accept`). The repairs (`descent_repairs`) and the coarse moves (`coarse_moves`) build on
it; `DescentState` is a descent in progress, `Descent` the plan it found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perseusd.planner.following import PointFollower
from perseusd.planner.switch_core import Found, ScanLimits, StageCost, switch_core
from perseusd.planner.switching import late_begins

Rows = tuple[tuple[int, ...], ...]
"""Clocks per stage, in schedule order."""


@dataclass(frozen=True)
class Descent:
    """The plan a descent found."""

    clocks_mhz: Rows
    """Per stage, in schedule order: the clocks to deploy."""
    time_s: float
    """The conservative iteration time (see `switch_search`'s docstring)."""
    energy_j: float
    evaluations: int
    moves: int


KeptTrials = dict[int, tuple[tuple[int, ...], list[tuple[int, ...]]]]
"""Per stage, its row and the trials built for it (`kept_trials`): rebuilt only when the row changes."""


def kept_trials(
    kept: KeptTrials,
    stage: int,
    row: tuple[int, ...],
    build: Callable[[int, tuple[int, ...]], list[tuple[int, ...]]],
) -> list[tuple[int, ...]]:
    """The stage's trials for `row`, built by `build(stage, row)` only when its row changed."""
    if kept.get(stage, ((),))[0] != row:
        kept[stage] = (row, build(stage, row))
    return kept[stage][1]


@dataclass
class DescentState:
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


class DescentTrials:
    """One job's DAG, profile and switch model, and the core that judges a descent's trials on them
    (`switch_search.DescentSearch` puts the repairs and the moves on top)."""

    def __init__(self, follower: PointFollower, use_c: bool = True) -> None:
        """Trials on `follower`'s job, model and stage options (its `waiting` power too)."""
        self.follower = follower
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

    def _take(
        self, state: DescentState, energy_j: float, time_s: float, stage: int, row: tuple[int, ...]
    ) -> None:
        """Apply a judged trial: `row` becomes the stage's, in the state and in the core."""
        state.apply(energy_j, time_s, stage, row, self.core.stage_cost(stage, list(row)))
        self.core.accept(stage)

    def _accept(self, state: DescentState, stage: int, found: Found) -> None:
        """Apply a move the core found (`scan`, `judge_rows`) for the stage."""
        energy_j, time_s, row, cost = found
        state.apply(energy_j, time_s, stage, row, cost)
        self.core.stage_cost(stage, list(row))
        self.core.accept(stage)

    def _trial(self, state: DescentState, stage: int, row: tuple[int, ...]) -> tuple[float, float, StageCost]:
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
        state: DescentState,
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

    def _energy(self, costs: Sequence[StageCost], time_s: float) -> float:
        """The plan's energy at iteration time `time_s` (the core's current durations): its stages' plus
        blocking power while waiting, or its waits at the clocks held (`SwitchCore.trial_waits`)."""
        if self.waiting is not None:
            return sum(cost[0] for cost in costs) + self.core.trial_waits(0, time_s)
        busy_s = sum(cost[1] for cost in costs)
        waiting_j = self.p_block_w * (self.dag.num_stages * time_s - busy_s)
        return sum(cost[0] for cost in costs) + waiting_j

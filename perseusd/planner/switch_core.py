"""The switch-aware descent's inner loop: one stage's planned clocks judged as they will really run, and the
plan's iteration time with that stage changed.

`_switchcore.Core` (C) runs it where it was built; `PyCore` is its executable specification, the same
figures to the bit (the tests compare them), and runs elsewhere. Both keep every stage's current durations
and one stage's trial:

- `stage_cost(stage, row)`: (energy, busy time, late begins) of one stage's planned clocks: each computation
  at its effective clock (`followable_stage_clocks`), its duration the slower of its planned and effective
  clocks' times, the late begins `late_begins` counts; the durations become the stage's trial;
- `trial_time(stage)`: the longest path with that stage's trial in place of its current durations;
- `trial_waits(stage, time_s)`: with a waiting power by held clock (`waits_w`), the energy of every GPU's
  waits in an iteration of `time_s` with that stage's trial in place, as `waiting.held_waiting_j` counts
  them for the effective plan (each computation at its effective clock's time, as early as the DAG allows;
  the wait before a computation held at its effective clock, a lowering's first `latency_s` at the previous
  computation's): what `PointFollower.follow` predicts for the plan; 0 without one;
- `accept(stage)`: the trial becomes the stage's current durations (and held clocks);
- `follow_row(stage, row)`: one stage row as it will really run (`FollowedRow`), for following a frontier;
- `merged(stage, row, min_run_s)`: the row with its short lowered runs merged (`merged_stage_clocks`), for
  following a frontier (`following`);
- `scan(...)`: the descent's moves of one stage (`moves`), each judged as above, and the best that beats a
  bound within the time limit and the late-begin cap (see `PyCore.scan`);
- `judge_rows(...)`: the same over given rows (the descent's coarse moves), or the best by energy added per
  late begin removed (its merge repair).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import SWITCHCORE, dag_arrays, longest_path_s, stage_ptr_of
from perseusd.planner.switching import (
    StageOptions,
    SwitchModel,
    followable_stage_clocks,
    late_begins,
    merged_stage_clocks,
)
from perseusd.planner.waiting import Held, WaitingPower, held_waits_j

StageWaits = list[dict[int, float]]
"""One stage's waiting power (W) while each computation's clock is held, per computation in schedule order:
clock MHz -> W (`WaitingPower.at_w` of each measured clock)."""
StageCost = tuple[float, float, int]
"""One stage's (energy at the effective clocks, time computing at them, late begins)."""
Found = tuple[float, float, tuple[int, ...], StageCost]
"""A scan's best move: (plan energy, plan time, the stage's new row, its cost)."""


@dataclass(frozen=True)
class ScanLimits:
    """What a stage's moves are judged against (`PyCore.scan`)."""

    late: int
    """The plan's late begins now."""
    late_others: int
    """Those of the other stages."""
    allowed: int
    repairing: bool
    limit_s: float
    bound_j: float
    """A move must use less energy than this (by 1e-12 J)."""
    energy_before: float
    """The stages before the scanned one: their energies and busy times summed in order."""
    busy_before: float
    after: tuple[tuple[float, float], ...]
    """The stages after it: (energy, busy time) each, in order."""
    p_block_w: float
    num_stages: int
    remaining: int
    """Evaluations left in the descent's budget."""
    late_price_j: float = 0.0
    """A move is judged by its energy plus this much per late begin of the plan (not with `per_late`)."""

    def args(self) -> tuple[Any, ...]:
        """The arguments of `_switchcore.Core.scan` after the stage and its row."""
        return (
            *(self.late, self.late_others, self.allowed, self.repairing, self.limit_s, self.bound_j),
            *(
                self.energy_before,
                self.busy_before,
                self.after,
                self.p_block_w,
                self.num_stages,
                self.remaining,
                self.late_price_j,
            ),
        )


FollowedRow = tuple[list[int], int, list[float], list[float]]
"""One stage row as it will really run: its effective clocks, late begins (`late_begins`), and each
computation's time and energy at its effective clock."""


class SwitchCore(Protocol):
    """What the descent and the follower (`following`) ask of a core (`PyCore` or `_switchcore.Core`)."""

    def stage_cost(self, stage: int, row: Sequence[int]) -> tuple[float, float, int]: ...
    def follow_row(self, stage: int, row: Sequence[int]) -> FollowedRow: ...
    def merged(self, stage: int, row: Sequence[int], min_run_s: float) -> list[int]: ...
    def trial_time(self, stage: int) -> float: ...
    def trial_waits(self, stage: int, time_s: float) -> float: ...
    def accept(self, stage: int) -> None: ...
    def scan(self, stage: int, row: Sequence[int], *limits: Any) -> tuple[int, bool, Found | None]: ...
    def judge_rows(
        self, stage: int, rows: Iterable[Sequence[int]], per_late_from_j: float | None, *limits: Any
    ) -> tuple[int, bool, Found | None]: ...


def moves(costs: StageOptions, row: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every distinct row of one stage that sets a cyclic segment of `row` to one clock (each computation at
    its lowest measured clock at or above it): clocks ascending, then segments by first computation and
    length."""
    n = len(row)
    seen: set[tuple[int, ...]] = {tuple(row)}
    for clock_mhz in costs.all_clocks_mhz:
        snapped = [costs.snap_up(k, clock_mhz) for k in range(n)]
        for first in range(n):
            trial = list(row)
            for length in range(n):
                k = (first + length) % n
                trial[k] = snapped[k]
                key = tuple(trial)
                if key not in seen:
                    seen.add(key)
                    yield key


class PyCore:
    """The executable specification of `_switchcore.Core`."""

    def __init__(
        self,
        dag: ComputationDag,
        stages: Sequence[StageOptions],
        model: SwitchModel,
        waits_w: Sequence[StageWaits] | None = None,
    ) -> None:
        self.dag, self.stages, self.model, self.waits_w = dag, stages, model, waits_w
        self._current: list[list[float]] = [[0.0] * len(ids) for ids in dag.stage_orders]
        self._trial: list[list[float]] = [list(durations) for durations in self._current]
        # Per stage, per computation: (effective clock, waiting W at it, its time at that clock).
        self._held: list[list[Held]] = [[(0, 0.0, 0.0)] * len(ids) for ids in dag.stage_orders]
        self._trial_held = [list(held) for held in self._held]

    def stage_cost(self, stage: int, row: Sequence[int]) -> tuple[float, float, int]:
        costs = self.stages[stage]
        planned = list(row)
        effective = followable_stage_clocks(planned, costs.time_at, costs.snap_up, self.model)
        durations_s, held = [], []
        energy_j = busy_s = 0.0
        for k, (clock_mhz, planned_mhz) in enumerate(zip(effective, planned, strict=True)):
            ran_s = costs.time_s[k][clock_mhz]
            duration_s = max(ran_s, costs.time_s[k][planned_mhz])
            durations_s.append(duration_s)
            energy_j += costs.energy_j[k][clock_mhz]
            busy_s += ran_s
            if self.waits_w is not None:
                waiting_w = self.waits_w[stage][k][clock_mhz]
                held.append((clock_mhz, waiting_w, ran_s))
        self._trial[stage] = durations_s
        self._trial_held[stage] = held
        return energy_j, busy_s, late_begins(planned, costs.time_at, self.model)

    def follow_row(self, stage: int, row: Sequence[int]) -> FollowedRow:
        costs = self.stages[stage]
        really = followable_stage_clocks(row, costs.time_at, costs.snap_up, self.model)
        times_s = [costs.time_s[k][clock] for k, clock in enumerate(really)]
        energies_j = [costs.energy_j[k][clock] for k, clock in enumerate(really)]
        return really, late_begins(row, costs.time_at, self.model), times_s, energies_j

    def merged(self, stage: int, row: Sequence[int], min_run_s: float) -> list[int]:
        costs = self.stages[stage]
        return merged_stage_clocks(row, costs.time_at, costs.snap_up, min_run_s)

    def trial_time(self, stage: int) -> float:
        rows = [*self._current[:stage], self._trial[stage], *self._current[stage + 1 :]]
        return longest_path_s(self.dag, [d for row in rows for d in row])

    def trial_waits(self, stage: int, time_s: float) -> float:
        if self.waits_w is None:
            return 0.0
        held_rows = [*self._held[:stage], self._trial_held[stage], *self._held[stage + 1 :]]
        held = [h for row in held_rows for h in row]
        return held_waits_j(self.dag, held, time_s, self.model.latency_s)

    def accept(self, stage: int) -> None:
        self._current[stage] = self._trial[stage]
        self._held[stage] = self._trial_held[stage]

    def scan(self, stage: int, row: Sequence[int], *limits: Any) -> tuple[int, bool, Found | None]:
        """(evaluations used, whether the budget ran out, the best move or None) over `moves(row)`: a move is
        judged while `remaining` lasts; it must keep the late begins under `late` (`repairing`) or within
        `allowed`, the time within `limit_s` and use less energy than the bound, which each best lowers.
        The plan's energy sums the stages in order (`energy_before`, this stage's, each of `after`) plus
        blocking power while waiting (with `waits_w`: `trial_waits` instead); `limits` are
        `ScanLimits.args()`."""
        return self._judge_each(stage, moves(self.stages[stage], row), None, ScanLimits(*limits))

    def judge_rows(
        self, stage: int, rows: Iterable[Sequence[int]], per_late_from_j: float | None, *limits: Any
    ) -> tuple[int, bool, Found | None]:
        """`scan` over the given `rows` of the stage instead of its segment moves. With `per_late_from_j` (the
        plan's energy now) a row is judged by the energy it adds per late begin it removes, and must remove
        one (`late` is the plan's late begins now); the best is the least such, not by 1e-12 J."""
        return self._judge_each(stage, rows, per_late_from_j, ScanLimits(*limits))

    def _judge_each(
        self, stage: int, rows: Iterable[Sequence[int]], per_late_from_j: float | None, lim: ScanLimits
    ) -> tuple[int, bool, Found | None]:
        used, bound, best = 0, lim.bound_j, None
        for trial in rows:
            if used >= lim.remaining:
                return used, True, best
            used += 1
            judged = self._judge(stage, trial, per_late_from_j, lim, bound)
            if judged is not None:
                bound, best = judged
        return used, False, best

    def _judge(
        self, stage: int, trial: Sequence[int], per_late_from_j: float | None, lim: ScanLimits, bound: float
    ) -> tuple[float, Found] | None:
        """(its key, the move) when the trial row beats `bound`, else None."""
        cost = self.stage_cost(stage, trial)
        trial_late = lim.late_others + cost[2]
        if per_late_from_j is not None or lim.repairing:
            if trial_late >= lim.late:
                return None
        elif trial_late > lim.allowed:
            return None
        time_s = self.trial_time(stage)
        energy_j, busy_s = lim.energy_before + cost[0], lim.busy_before + cost[1]
        for other in lim.after:
            energy_j += other[0]
            busy_s += other[1]
        if self.waits_w is None:
            energy_j += lim.p_block_w * (lim.num_stages * time_s - busy_s)
        else:
            energy_j += self.trial_waits(stage, time_s)
        if per_late_from_j is None:
            key = energy_j + lim.late_price_j * trial_late
            beats = key < bound - 1e-12
        else:
            key = (energy_j - per_late_from_j) / (lim.late - trial_late)
            beats = key < bound
        if time_s <= lim.limit_s and beats:
            return key, (energy_j, time_s, tuple(trial), cost)
        return None


def stage_waits(stages: Sequence[StageOptions], waiting: WaitingPower) -> list[StageWaits]:
    """Every stage's waiting power at each computation's measured clocks."""
    return [
        [{clock: waiting.at_w(clock) for clock in clocks} for clocks in costs.clocks_mhz] for costs in stages
    ]


_C_CORE = None if SWITCHCORE is None else SWITCHCORE.Core


def switch_core(
    dag: ComputationDag,
    stages: Sequence[StageOptions],
    model: SwitchModel,
    use_c: bool = True,
    waiting: WaitingPower | None = None,
) -> SwitchCore:
    """The descent's core for one job (nodes numbered stage by stage in schedule order), in C when built;
    with a `waiting` power by held clock (not constant), plans wait at the clocks held (`trial_waits`)."""
    waits_w = stage_waits(stages, waiting) if waiting is not None and not waiting.constant else None
    if not use_c or _C_CORE is None:
        return PyCore(dag, stages, model, waits_w)
    stage_ptr = stage_ptr_of(dag)
    opt_ptr, opt_clock, opt_time, opt_energy = array("q", [0]), array("q"), array("d"), array("d")
    opt_wait = array("d")
    for stage, costs in enumerate(stages):
        for k, clocks in enumerate(costs.clocks_mhz):
            opt_clock.extend(clocks)
            opt_time.extend(costs.time_s[k][c] for c in clocks)
            opt_energy.extend(costs.energy_j[k][c] for c in clocks)
            if waits_w is not None:
                opt_wait.extend(waits_w[stage][k][c] for c in clocks)
            opt_ptr.append(len(opt_clock))
    arrays = (*dag_arrays(dag), stage_ptr, opt_ptr, opt_clock, opt_time, opt_energy)
    core: SwitchCore = _C_CORE(*arrays, model.latency_s, model.lead_s, opt_wait=opt_wait)
    return core

"""The switch-aware descent's inner loop: one stage's planned clocks judged as they will really run, and the
plan's iteration time with that stage changed.

`_switchcore.Core` (C) runs it where it was built; `PyCore` is its executable specification, the same
figures to the bit (the tests compare them), and runs elsewhere. Both keep every stage's current durations
and one stage's trial:

- `stage_cost(stage, row)`: (energy, busy time, late begins) of one stage's planned clocks: each computation
  at its effective clock (`followable_stage_clocks`), its duration the slower of its planned and effective
  clocks' times, the late begins `late_begins` counts; the durations become the stage's trial;
- `trial_time(stage)`: the longest path with that stage's trial in place of its current durations;
- `accept(stage)`: the trial becomes the stage's current durations;
- `scan(...)`: the descent's moves of one stage (`moves`), each judged as above, and the best that beats a
  bound within the time limit and the late-begin cap (see `PyCore.scan`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import SWITCHCORE, dag_arrays, longest_path_s
from perseusd.planner.switching import StageOptions, SwitchModel, followable_stage_clocks, late_begins

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
            ),
        )


class SwitchCore(Protocol):
    """What the descent asks of its core (`PyCore` or `_switchcore.Core`)."""

    def stage_cost(self, stage: int, row: Sequence[int]) -> tuple[float, float, int]: ...
    def trial_time(self, stage: int) -> float: ...
    def accept(self, stage: int) -> None: ...
    def scan(self, stage: int, row: Sequence[int], *limits: Any) -> tuple[int, bool, Found | None]: ...


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

    def __init__(self, dag: ComputationDag, stages: Sequence[StageOptions], model: SwitchModel) -> None:
        self.dag, self.stages, self.model = dag, stages, model
        self._current: list[list[float]] = [[0.0] * len(ids) for ids in dag.stage_orders]
        self._trial: list[list[float]] = [list(durations) for durations in self._current]

    def stage_cost(self, stage: int, row: Sequence[int]) -> tuple[float, float, int]:
        costs = self.stages[stage]
        planned = list(row)
        effective = followable_stage_clocks(planned, costs.time_at, costs.snap_up, self.model)
        durations_s = []
        energy_j = busy_s = 0.0
        for k, (clock_mhz, planned_mhz) in enumerate(zip(effective, planned, strict=True)):
            ran_s = costs.time_s[k][clock_mhz]
            durations_s.append(max(ran_s, costs.time_s[k][planned_mhz]))
            energy_j += costs.energy_j[k][clock_mhz]
            busy_s += ran_s
        self._trial[stage] = durations_s
        return energy_j, busy_s, late_begins(planned, costs.time_at, self.model)

    def trial_time(self, stage: int) -> float:
        rows = [*self._current[:stage], self._trial[stage], *self._current[stage + 1 :]]
        return longest_path_s(self.dag, [d for row in rows for d in row])

    def accept(self, stage: int) -> None:
        self._current[stage] = self._trial[stage]

    def scan(self, stage: int, row: Sequence[int], *limits: Any) -> tuple[int, bool, Found | None]:
        """(evaluations used, whether the budget ran out, the best move or None) over `moves(row)`: a move is
        judged while `remaining` lasts; it must keep the late begins under `late` (`repairing`) or within
        `allowed`, the time within `limit_s` and use less energy than the bound, which each best lowers.
        The plan's energy sums the stages in order (`energy_before`, this stage's, each of `after`) plus
        blocking power while waiting; `limits` are `ScanLimits.args()`."""
        lim = ScanLimits(*limits)
        used, bound_j, best = 0, lim.bound_j, None
        for trial in moves(self.stages[stage], row):
            if used >= lim.remaining:
                return used, True, best
            used += 1
            cost = self.stage_cost(stage, trial)
            trial_late = lim.late_others + cost[2]
            if trial_late >= lim.late if lim.repairing else trial_late > lim.allowed:
                continue
            time_s = self.trial_time(stage)
            energy_j, busy_s = lim.energy_before + cost[0], lim.busy_before + cost[1]
            for other in lim.after:
                energy_j += other[0]
                busy_s += other[1]
            energy_j += lim.p_block_w * (lim.num_stages * time_s - busy_s)
            if time_s <= lim.limit_s and energy_j < bound_j - 1e-12:
                bound_j, best = energy_j, (energy_j, time_s, trial, cost)
        return used, False, best


_C_CORE = None if SWITCHCORE is None else SWITCHCORE.Core


def switch_core(
    dag: ComputationDag, stages: Sequence[StageOptions], model: SwitchModel, use_c: bool = True
) -> SwitchCore:
    """The descent's core for one job (nodes numbered stage by stage in schedule order), in C when built."""
    if not use_c or _C_CORE is None:
        return PyCore(dag, stages, model)
    stage_ptr = array("q", [0])
    opt_ptr, opt_clock, opt_time, opt_energy = array("q", [0]), array("q"), array("d"), array("d")
    for ids, costs in zip(dag.stage_orders, stages, strict=True):
        if ids and ids[0] != stage_ptr[-1]:
            raise ValueError("the DAG's nodes are not numbered stage by stage in schedule order")
        stage_ptr.append(stage_ptr[-1] + len(ids))
        for k, clocks in enumerate(costs.clocks_mhz):
            opt_clock.extend(clocks)
            opt_time.extend(costs.time_s[k][c] for c in clocks)
            opt_energy.extend(costs.energy_j[k][c] for c in clocks)
            opt_ptr.append(len(opt_clock))
    core: SwitchCore = _C_CORE(
        *dag_arrays(dag), stage_ptr, opt_ptr, opt_clock, opt_time, opt_energy, model.latency_s, model.lead_s
    )
    return core

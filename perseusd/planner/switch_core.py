"""The switch-aware descent's inner loop: one stage's planned clocks judged as they will really run, and the
plan's iteration time with that stage changed.

`_switchcore.Core` (C) runs it where it was built; `PyCore` is its executable specification, the same
figures to the bit (the tests compare them), and runs elsewhere. Both keep every stage's current durations
and one stage's trial:

- `stage_cost(stage, row)`: (energy, busy time, late begins) of one stage's planned clocks: each computation
  at its effective clock (`followable_stage_clocks`), its duration the slower of its planned and effective
  clocks' times, the late begins `late_begins` counts; the durations become the stage's trial;
- `trial_time(stage)`: the longest path with that stage's trial in place of its current durations;
- `accept(stage)`: the trial becomes the stage's current durations.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Protocol

from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import dag_arrays, longest_path_s
from perseusd.planner.switching import StageOptions, SwitchModel, followable_stage_clocks, late_begins


class SwitchCore(Protocol):
    """What the descent asks of its core (`PyCore` or `_switchcore.Core`)."""

    def stage_cost(self, stage: int, row: Sequence[int]) -> tuple[float, float, int]: ...
    def trial_time(self, stage: int) -> float: ...
    def accept(self, stage: int) -> None: ...


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


def _load_c_core() -> Any | None:
    try:
        from perseusd.planner import _switchcore  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _switchcore.Core


_C_CORE = _load_c_core()


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

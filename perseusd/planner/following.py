"""Following a frontier: each point as the GPUs will really run it under a switch model (`switching`).

`follow_frontier` merges each point's short lowered runs (`switching.merged_stage_clocks`), plays its stage
rows out (`switching.followable_stage_clocks`, `late_begins`) and evaluates the plan that will really run,
with its waits at the clocks held (`waiting`). `PointFollower` does it for one job, each distinct stage row
once; the merge, each row's effective clocks and late begins, the longest path and the held waits run in
the C core where it was built (`switch_core`, `_switchcore.c`: the same operations in the same order, so
the same bits).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from itertools import chain

from perseusd.planner.dag import ComputationDag
from perseusd.planner.evaluate import LongestPath
from perseusd.planner.plan import Followed, Frontier, Plan, RowSharer, SwitchingMeta
from perseusd.planner.profile import Profile
from perseusd.planner.switch_core import switch_core
from perseusd.planner.switching import (
    SnapUp,
    StageOptions,
    SwitchModel,
    TimeAt,
)
from perseusd.planner.waiting import HeldWaits, WaitingPower


def follow_frontier(
    frontier: Frontier,
    dag: ComputationDag,
    profile: Profile,
    p_block_w: float,
    model: SwitchModel,
    waiting: WaitingPower | None = None,
) -> Frontier:
    """`frontier` with points that state what the GPUs will really do under `model`.

    With `model.min_run_s`, each point's short lowered runs are first merged into a higher neighbour
    (`merged_stage_clocks`): its `clocks_mhz` become the merged ones (what gets deployed) and the solver's
    are kept as `followed.solved_clocks_mhz`. Each point gains `followed`: the effective clocks (what will
    really run), the computations not at their planned clock, and the solver's refined time and energy
    (`planned_time_s` / `planned_energy_j`); its `refined_time_s` and `refined_energy_j` become the
    effective plan's, evaluated on the profile. The frontier gains `switching` (the model).

    Neighbouring points differ in a few stages only: each distinct stage row is merged and followed once
    (`PointFollower` keeps them), so a point costs about one longest path through the DAG.
    """
    points = []
    follower = PointFollower(dag, profile, p_block_w, model, waiting)
    merged_rows = RowSharer()
    merged_memo: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(dag.num_stages)]
    for solved in frontier.points:
        clocks = solved.clocks_mhz
        if model.min_run_s > 0:
            clocks = merged_rows.share(
                [follower.merged(stage, row, merged_memo[stage]) for stage, row in enumerate(clocks)]
            )
        solved_clocks = solved.clocks_mhz if model.min_run_s > 0 else None
        points.append(
            follower.follow(solved, clocks, solved.predicted_time_s, solved.refined_energy_j, solved_clocks)
        )
    switching = SwitchingMeta(model.latency_s, model.lead_s, model.min_run_s)
    return replace(frontier, points=tuple(points), switching=switching)


@dataclass(frozen=True)
class _FollowedRow:
    """One stage row of planned clocks as it will really run."""

    effective_mhz: tuple[int, ...]
    changed: int
    late: int
    """Computations begun before their planned clock is applied (`late_begins`)."""
    times_s: array[float]
    """Per computation, at its effective clock."""
    energies_j: array[float]
    waits_w: array[float]
    """Per computation, the waiting power at its effective clock (empty without a waiting power by clock)."""


class PointFollower:
    """Plays plans of one job out under one switch model (`follow`), each distinct stage row once."""

    def __init__(
        self,
        dag: ComputationDag,
        profile: Profile,
        p_block_w: float,
        model: SwitchModel,
        waiting: WaitingPower | None = None,
        use_c: bool = True,
    ) -> None:
        """`use_c=False`: the Python implementations throughout (the same figures; for the tests)."""
        self.dag, self.profile, self.p_block_w, self.model = dag, profile, p_block_w, model
        self.waiting = waiting if waiting is not None and not waiting.constant else None
        self.stages = [StageOptions(dag, profile, stage) for stage in range(dag.num_stages)]
        self._core = switch_core(dag, self.stages, model, use_c=use_c)
        self._effective_rows = RowSharer()
        self._followed: list[dict[tuple[int, ...], _FollowedRow]] = [{} for _ in range(dag.num_stages)]
        self.longest_path_s = LongestPath(dag, use_c)
        self._held_waits = HeldWaits(dag, model.latency_s, use_c) if self.waiting is not None else None
        self._waiting_w: dict[int, float] = {}

    def time_at(self, stage: int) -> TimeAt:
        return self.stages[stage].time_at

    def snap_up(self, stage: int) -> SnapUp:
        return self.stages[stage].snap_up

    def merged(self, stage: int, row: tuple[int, ...], memo: dict[tuple[int, ...], list[int]]) -> list[int]:
        """`merged_stage_clocks` of one stage row, from `memo` when it was merged before."""
        found = memo.get(row)
        if found is None:
            found = memo[row] = self._core.merged(stage, row, self.model.min_run_s)
        return found

    def _follow_row(self, stage: int, row: tuple[int, ...]) -> _FollowedRow:
        """`followable_stage_clocks` of one stage row with its computations' measured time and energy."""
        found = self._followed[stage].get(row)
        if found is None:
            really, late, times_s, energies_j = self._core.follow_row(stage, row)
            changed = sum(1 for old, new in zip(row, really, strict=True) if new != old)
            waits = array(
                "d", (self._waiting_at_w(clock) for clock in really) if self.waiting is not None else ()
            )
            times, energies = array("d", times_s), array("d", energies_j)
            found = _FollowedRow(tuple(really), changed, late, times, energies, waits)
            self._followed[stage][row] = found
        return found

    def _waiting_at_w(self, clock_mhz: int) -> float:
        """The waiting power at `clock_mhz` (there is a waiting power by clock), each clock computed once."""
        found = self._waiting_w.get(clock_mhz)
        if found is None:
            assert self.waiting is not None
            found = self._waiting_w[clock_mhz] = self.waiting.at_w(clock_mhz)
        return found

    def follow(
        self,
        point: Plan,
        clocks_mhz: tuple[tuple[int, ...], ...],
        planned_time_s: float,
        planned_energy_j: float,
        solved_clocks_mhz: tuple[tuple[int, ...], ...] | None,
        descended_from: int | None = None,
    ) -> Plan:
        """`point` deploying `clocks_mhz`, with `followed` and its refined time and energy the effective
        plan's (`planned_*`: the figures of `clocks_mhz` with instant switches).

        The effective plan is evaluated as `evaluate_clocks` does, with the same sums in the same order
        (nodes are numbered stage by stage in schedule order), so the figures are the same bits. With a
        waiting power by held clock, its waits are at the clocks held in them instead (`held_waiting_j`),
        and `planned_energy_j` gets the same correction (its waits as the effective plan's)."""
        rows = [self._follow_row(stage, row) for stage, row in enumerate(clocks_mhz)]
        times_s = list(chain.from_iterable(row.times_s for row in rows))
        time_s = self.longest_path_s(times_s)
        compute_j = sum(chain.from_iterable(row.energies_j for row in rows))
        blocking_j = self.p_block_w * (self.dag.num_stages * time_s - sum(times_s))
        if self.waiting is not None:
            held_j = self.waiting_j(clocks_mhz, time_s)[1]
            planned_energy_j += held_j - blocking_j
            blocking_j = held_j
        changed = sum(row.changed for row in rows)
        effective = tuple(row.effective_mhz for row in rows) if changed else clocks_mhz
        return replace(
            point,
            clocks_mhz=clocks_mhz,
            refined_time_s=time_s,
            refined_energy_j=compute_j + blocking_j,
            followed=Followed(
                planned_time_s=planned_time_s,
                planned_energy_j=planned_energy_j,
                effective_clocks_mhz=self._effective_rows.share(effective),
                switch_changed=changed,
                solved_clocks_mhz=solved_clocks_mhz,
                descended_from=descended_from,
                late_begins=sum(row.late for row in rows),
            ),
        )

    def waiting_j(self, clocks_mhz: tuple[tuple[int, ...], ...], time_s: float) -> tuple[float, float]:
        """The waits' energy when `clocks_mhz` are deployed and an iteration takes `time_s`: at the
        blocking power, and each wait at the effective clock held in it (the same without a waiting power)."""
        rows = [self._follow_row(stage, row) for stage, row in enumerate(clocks_mhz)]
        times_s = list(chain.from_iterable(row.times_s for row in rows))
        blocking_j = self.p_block_w * (self.dag.num_stages * time_s - sum(times_s))
        if self._held_waits is None:
            return blocking_j, blocking_j
        effective = list(chain.from_iterable(row.effective_mhz for row in rows))
        waits_w = list(chain.from_iterable(row.waits_w for row in rows))
        return blocking_j, self._held_waits(effective, waits_w, times_s, time_s)

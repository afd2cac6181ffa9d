"""Do no harm: a stage whose plan would not measurably save runs one clock instead.

A no-slowdown plan lowers computations where the schedule leaves them slack. On the stage that sets the
pipeline's pace (or on a one-stage job) little slack remains: what the plan saves there can be smaller than
what the profile cannot tell apart (each option's energy has a standard error) plus what its clock changes
cost (a lock takes effect a latency after it is asked for, so the computation after a change runs part of
its time at the previous clock's power). Such a plan spends more than it saves as often as not: on a real
H200 a one-stage job's plan at all-max time measured 1.25 % more energy than all-max.

So each stage's plan is compared with the stage's **safe clock**: the lowest-energy clock at which none of
the stage's computations is slower than at its highest measured clock (on a GPU whose top clocks are
power-capped, a clock on the capped plateau: the same time for less energy; elsewhere, the highest clock),
or at which the stage is busy no longer in all than there and the plan's iteration, the stage at that clock
and every other computation at its planned one, is no longer than planned or than with the stage at its
highest clocks. The second matters on a capped GPU whose light computations run uncapped: a
forward slightly slower at 1725 MHz than at 1980 while the backward is a millisecond faster; by the first
test alone the stage would run 1980, slower and costlier than a capped clock (a real H200 layer sweep's last
stage). Running the safe clock throughout never slows the pipeline and changes no clock within an
iteration. The stage keeps its plan only when

    E_stage(safe clock) - E_stage(plan)  >  uncertainty  +  switching cost

- energies per iteration from the profile: the stage's computations plus its blocking power until the
  iteration's end (the plan's iteration time);
- uncertainty: the standard uncertainty (one standard error) of that difference, from each option's
  relative energy error (options the two use equally often cancel; the others' errors add in quadrature,
  an option used n times more counting n times its error);
- switching cost: for each clock change of the plan (cyclically, as the stage runs iteration after
  iteration), the computation after the change does part of its work at the previous clock: for the mean
  time a new clock takes to act, half the GPU's measured clock-set latency (a lock acts part-way through
  the call: 0-12 ms into a 9-15 ms call on an H100). That share of its work costs what it costs at the
  previous clock instead of at its own.

Pure: no I/O, no job state.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perseusd.errors import PerseusError
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.evaluate import longest_path_s
from perseusd.planner.profile import Measurement, Profile

K_SIGMA = 1.0
"""Standard errors a plan's saving must clear on top of its switching cost: the standard uncertainty."""
ACTING_SHARE = 0.5
"""The share of the measured clock-set latency after which, on average, a new clock acts."""

OptionKey = tuple[int, Instruction, int]
"""(profile stage, instruction, clock MHz)."""


@dataclass(frozen=True)
class StageVerdict:
    """Whether one stage keeps its plan, with the figures behind it (J per iteration)."""

    stage: int
    keep_plan: bool
    safe_clock_mhz: int
    saving_j: float
    """Predicted energy of the stage at its safe clock minus with its plan."""
    uncertainty_j: float
    """K_SIGMA standard errors of `saving_j`."""
    switching_j: float

    def reason(self) -> str:
        """One line for `perseusctl jobs` and the log when the stage runs its safe clock."""
        return (
            f"stage {self.stage} runs {self.safe_clock_mhz} MHz throughout: its plan would save "
            f"{self.saving_j:.2f} J/iteration, within its uncertainty {self.uncertainty_j:.2f} J plus clock "
            f"changes {self.switching_j:.2f} J"
        )


def judge_stages(
    dag: ComputationDag,
    profile: Profile,
    clocks_mhz: Sequence[int],
    p_block_w: float,
    iteration_time_s: float,
    energy_rel_err: Mapping[OptionKey, float],
    latency_s: float,
) -> list[StageVerdict]:
    """A verdict per GPU stage of `dag` for the plan `clocks_mhz` (a clock per node). Options missing from
    `energy_rel_err` count as exact (an imported profile). Stages with no safe clock, or whose plan runs it
    throughout already, are not judged (they keep their plan)."""
    verdicts = []
    chosen = [_lookup(profile, dag, n, clock_mhz) for n, clock_mhz in enumerate(clocks_mhz)]
    times = PlannedTimes([m.time_s for m in chosen], iteration_time_s)
    for stage, nodes in enumerate(dag.stage_orders):
        safe_mhz = safe_clock_mhz(dag, profile, nodes, times)
        if safe_mhz is None or all(clocks_mhz[n] == safe_mhz for n in nodes):
            continue
        planned = [chosen[n] for n in nodes]
        safe = [_lookup(profile, dag, n, safe_mhz) for n in nodes]
        saving_j = _busy_and_blocking_j(safe, p_block_w, iteration_time_s) - _busy_and_blocking_j(
            planned, p_block_w, iteration_time_s
        )
        uncertainty_j = K_SIGMA * _difference_sigma_j(planned, safe, energy_rel_err)
        switching_j = _switching_j(profile, planned, latency_s)
        keep = saving_j > uncertainty_j + switching_j
        verdicts.append(StageVerdict(stage, keep, safe_mhz, saving_j, uncertainty_j, switching_j))
    return verdicts


@dataclass(frozen=True)
class PlannedTimes:
    """A plan's computation times (s, by DAG node) and iteration time: what a safe clock may not exceed."""

    times_s: Sequence[float]
    iteration_s: float


def safe_clock_mhz(
    dag: ComputationDag, profile: Profile, nodes: Sequence[int], planned: PlannedTimes | None = None
) -> int | None:
    """The lowest-energy clock, measured for every computation of `nodes`, at which none of them is slower
    than at its highest measured clock, or (with `planned`) at which they take no longer in all than there
    and the plan's iteration with them all at it takes no longer than planned or than with them at their
    highest clocks (None when the profile has no clock common to them)."""
    stage = _StageClocks(dag, profile, nodes)
    if not stage.counts:
        return None
    common = set.intersection(*({m.freq_mhz for m in profile.options(*key)} for key in stage.counts))
    for clock_mhz in sorted(common, key=lambda c: (stage.energy_j(c), -c)):
        if stage.not_slower(clock_mhz) or (planned is not None and stage.within(planned, clock_mhz)):
            return clock_mhz
    return None


class _StageClocks:
    """One stage's computations (`nodes`) at one clock throughout, on a profile."""

    def __init__(self, dag: ComputationDag, profile: Profile, nodes: Sequence[int]) -> None:
        self.dag, self.profile, self.nodes = dag, profile, nodes
        self.counts = Counter((dag.virtual_stage(n), dag.computations[n].instruction) for n in nodes)
        self.tops = {key: profile.lookup(*key, profile.max_freq_mhz(*key)) for key in self.counts}
        self._limit_s: float | None = None

    def energy_j(self, clock_mhz: int) -> float:
        return sum(self.profile.lookup(*key, clock_mhz).energy_j * n for key, n in self.counts.items())

    def not_slower(self, clock_mhz: int) -> bool:
        return all(
            self.profile.lookup(*key, clock_mhz).time_s <= top.time_s for key, top in self.tops.items()
        )

    def within(self, planned: PlannedTimes, clock_mhz: int) -> bool:
        """Busy no longer than at the top clocks (only clocks near the top count as safe), and the plan's
        iteration no longer than planned or than with the stage at its top clocks."""
        busy_s = sum(self.profile.lookup(*key, clock_mhz).time_s * n for key, n in self.counts.items())
        if busy_s > sum(self.tops[key].time_s * n for key, n in self.counts.items()):
            return False
        if self._limit_s is None:  # once per stage, for the first clock that gets this far
            self._limit_s = max(planned.iteration_s, self._iteration_s(planned, None))
        return self._iteration_s(planned, clock_mhz) <= self._limit_s * (1 + 1e-9)

    def _iteration_s(self, planned: PlannedTimes, clock_mhz: int | None) -> float:
        """The plan's iteration with the stage at `clock_mhz` throughout (None: each at its top clock)."""
        times_s = list(planned.times_s)
        for n in self.nodes:
            key = (self.dag.virtual_stage(n), self.dag.computations[n].instruction)
            times_s[n] = (
                self.tops[key].time_s if clock_mhz is None else self.profile.lookup(*key, clock_mhz).time_s
            )
        return longest_path_s(self.dag, times_s)


def _lookup(profile: Profile, dag: ComputationDag, node: int, clock_mhz: int) -> Measurement:
    try:
        return profile.lookup(dag.virtual_stage(node), dag.computations[node].instruction, clock_mhz)
    except PerseusError as exc:
        raise ValueError(f"the plan's clock {clock_mhz} MHz is not in the profile: {exc}") from None


def _busy_and_blocking_j(chosen: Sequence[Measurement], p_block_w: float, iteration_time_s: float) -> float:
    """One stage's computations (`chosen`, in its order) plus its blocking power until the iteration ends."""
    busy_s = sum(m.time_s for m in chosen)
    return sum(m.energy_j for m in chosen) + p_block_w * max(0.0, iteration_time_s - busy_s)


def _difference_sigma_j(
    planned: Sequence[Measurement], safe: Sequence[Measurement], energy_rel_err: Mapping[OptionKey, float]
) -> float:
    """The standard error of sum(safe) - sum(planned): each option's error counts once per net use."""
    net: Counter[OptionKey] = Counter()
    energy: dict[OptionKey, float] = {}
    for sign, chosen in ((1, safe), (-1, planned)):
        for m in chosen:
            key = (m.stage, m.instruction, m.freq_mhz)
            net[key] += sign
            energy[key] = m.energy_j
    variance = 0.0
    for key, uses in net.items():
        rel_err = energy_rel_err.get(key, 0.0)
        if uses and math.isfinite(rel_err):
            variance += (uses * energy[key] * rel_err) ** 2
        elif uses:
            return math.inf
    return math.sqrt(variance)


def _switching_j(profile: Profile, planned: Sequence[Measurement], latency_s: float) -> float:
    """Per iteration: at each clock change (the order is run over and over), the computation after it does
    part of its work at the previous clock, for `ACTING_SHARE x latency_s` of that clock's time: that share
    of the difference between its energy at the previous clock and at its own."""
    cost_j = 0.0
    for before, after in zip([planned[-1], *planned[:-1]], planned, strict=True):
        if before.freq_mhz == after.freq_mhz:
            continue
        at_previous = _at_clock(profile, after, before.freq_mhz)
        if at_previous is None:  # not measured at that clock: the previous computation's power stands in
            at_previous = Measurement(
                after.stage, after.instruction, before.freq_mhz, after.time_s, after.time_s * _power_w(before)
            )
        share = min(1.0, ACTING_SHARE * latency_s / at_previous.time_s) if at_previous.time_s > 0 else 1.0
        cost_j += share * abs(at_previous.energy_j - after.energy_j)
    return cost_j


def _at_clock(profile: Profile, m: Measurement, clock_mhz: int) -> Measurement | None:
    try:
        return profile.lookup(m.stage, m.instruction, clock_mhz)
    except PerseusError:
        return None


def _power_w(m: Measurement) -> float:
    return m.energy_j / m.time_s if m.time_s > 0 else 0.0

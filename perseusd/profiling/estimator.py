"""Per-computation time and energy from computation intervals and a coarse, noisy energy counter.

Time: the intervals' durations, per (option key, clock), with outliers beyond 3.5 scaled MADs dropped.

Energy: the counter changes only every 20-100 ms, far too coarsely to read one computation's energy, so every
pair of consecutive kept counter samples is a window with a known energy, and the windows are explained by
average powers. A window of duration d with energy E gives one linear equation

    E / d = sum over groups g of P_g * (overlap of g's intervals with the window) / d + P_block * idle / d

in the unknown power P_g of each (key, clock) group and, unless given, the blocking power P_block of the idle
GPU. Each equation is divided by the window's average power, because the counter's noise is relative to the
increment; the system is solved by non-negative least squares over every window, windows with outlying
residuals (beyond 3.5 scaled MADs) are dropped and the fit is repeated. Energy per computation = P_g x the
group's mean time. Standard errors come from the residual variance and the normal matrix.

Groups at one clock are tied by a weak prior (`power_fit.with_same_clock_prior`): their powers differ by 0
with a standard deviation of 15 % of their mean. Computations that always run back to back in the same
proportion (the last 1F1B stage's forward and backward) are told apart only by where the counter's window
edges fall, so event timing noise moves their split (a closed loop on the simulated H100 put a light last
stage's forward 26-36 % low); windows that do separate a pair outweigh the prior.

Windows are dropped when they cannot be trusted: the first one (the first sample's value may be an update
period old), those longer than 3x the median window (a gap in sampling) and the one after each (the read
that ended the gap may have seen an old update), those that lie outside the span of the intervals (activity
there is not recorded), those with no energy, and those that overlap an interval dropped as a time outlier
(its power is probably not its group's) unless the next computation began right after it (then it hid no
idle time: on a real GPU many computations run more than 2 % long, and dropping their windows left 7 of
25). Because a window is attributed by overlap and not by membership, windows may span several
computations, several keys and clock changes.

Groups that no usable window overlaps, or whose power the windows cannot tell apart from another group's
(they always run together in the same proportion), have no energy estimate and are left out of the result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseusd.profiling.power_fit import MAD_TO_SIGMA, OUTLIER_MADS, Fit, robust_fit, with_same_clock_prior
from perseusd.profiling.trace import CounterSample, Interval, OptionKey

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
GroupKey = tuple[OptionKey, int]
"""(option key, clock in MHz)."""

_NS_PER_S = 1e9
_MIN_RELATIVE_SPREAD = 0.02
"""Time outliers: never drop a duration within this fraction of the median (nearly identical durations)."""
_GAP_FACTOR = 3.0
_BACK_TO_BACK_NS = 500_000
"""An interval followed by another's begin within this is back to back with it (no idle time between)."""
P_BLOCK_MAX_REL_ERR = 0.25
"""`estimate_segment` keeps a segment's own blocking power only within this standard error (x fallback)."""
NOMINAL_IDLE_SHARE = 0.2
"""A GPU's idle power as a share of its least busy power, where no idle time tells it (H100 and H200: 130 W
idle at 1980 MHz against 600-700 W busy)."""


@dataclass(frozen=True)
class OptionEstimate:
    """The estimated cost of one computation of `key` at `clock_mhz`."""

    key: OptionKey
    clock_mhz: int
    count: int
    """Computations kept (time outliers dropped)."""
    time_s: float
    """Mean time per computation."""
    energy_j: float
    """Energy per computation."""
    time_rel_err: float
    """Standard error of `time_s` / `time_s`."""
    energy_rel_err: float
    """Standard error of `energy_j` / `energy_j` (power and time errors combined); inf when unknown."""
    windows: int = 0
    """Counter windows of the final fit that this option's computations overlap."""
    fitted: bool = False
    """Not measured: read off the key's fitted curves at a clock the sweep did not visit
    (`perseusd.profiling.fill`)."""


@dataclass(frozen=True)
class StageEstimate:
    """Every (key, clock) estimate of one GPU, with the blocking power used or regressed."""

    options: dict[GroupKey, OptionEstimate]
    p_block_w: float | None
    """Blocking (idle) power: the given value, or the regressed one (None: no idle time to regress on)."""
    windows: int
    """Counter windows used in the final fit."""
    p_block_err_w: float = 0.0
    """Standard error of a regressed `p_block_w` (0 when given; inf when the windows cannot tell it)."""
    p_block_regressed: bool = False
    """`p_block_w` was measured: regressed from these windows, not given (a fallback or a bound)."""

    @property
    def measured_p_block_w(self) -> float | None:
        """The blocking power these windows measured: what a GPU draws waiting at the segment's clock (None:
        given, not measured; a stand-in is no evidence of the waits at this clock)."""
        return self.p_block_w if self.p_block_regressed else None


@dataclass(frozen=True)
class _GroupTimes:
    """One group's intervals (ns, relative to the trace origin) and which of them are not time outliers."""

    starts_ns: IntArray
    ends_ns: IntArray
    kept: npt.NDArray[np.bool_]

    def mean_time_s(self) -> float:
        return float(np.mean(self.ends_ns[self.kept] - self.starts_ns[self.kept])) / _NS_PER_S

    def time_rel_err(self) -> float:
        durations = (self.ends_ns[self.kept] - self.starts_ns[self.kept]).astype(np.float64)
        if durations.size < 2 or not np.mean(durations) > 0:
            return math.inf
        return float(np.std(durations, ddof=1) / math.sqrt(durations.size) / np.mean(durations))


@dataclass(frozen=True)
class _Windows:
    """Counter windows: bounds (ns, relative to the trace origin) and energy (J)."""

    starts_ns: IntArray
    ends_ns: IntArray
    energy_j: FloatArray

    def select(self, mask: npt.NDArray[np.bool_]) -> _Windows:
        return _Windows(self.starts_ns[mask], self.ends_ns[mask], self.energy_j[mask])

    @property
    def durations_s(self) -> FloatArray:
        return (self.ends_ns - self.starts_ns).astype(np.float64) / _NS_PER_S


def estimate_stage(
    intervals: Sequence[Interval],
    samples: Sequence[CounterSample],
    *,
    p_block_w: float | None = None,
    blind: Sequence[tuple[int, int]] = (),
) -> StageEstimate:
    """Estimate every (key, clock)'s time and energy per computation on one GPU (see the module docstring).

    Args:
        intervals: the GPU's computations, in any order.
        samples: the GPU's kept counter samples (`CounterTrace.samples`), in any order.
        p_block_w: the GPU's blocking power when known; None: regress it too.
        blind: (start_ns, end_ns) of computations that ran but are not in `intervals` (their clock is not
            known): windows overlapping them are dropped.
    """
    if not intervals:
        return StageEstimate({}, p_block_w, 0)
    origin_ns = min([i.start_ns for i in intervals] + [s.t_ns for s in samples])
    groups = _group_times(intervals, origin_ns)
    if not groups:
        return StageEstimate({}, p_block_w, 0)
    windows = _usable_windows(samples, groups, origin_ns)
    if blind:
        spans = np.array(sorted(blind), dtype=np.int64).reshape(-1, 2) - origin_ns
        windows = windows.select(_overlap_s(windows, spans[:, 0], spans[:, 1]) <= 0)
    fit_keys, overlaps_s = _overlap_matrix(windows, groups)
    fit = _fit_powers(windows, overlaps_s, p_block_w, [clock for _, clock in fit_keys])
    if fit is None:
        return StageEstimate({}, p_block_w, 0)
    options: dict[GroupKey, OptionEstimate] = {}
    for column, key in enumerate(fit_keys):
        if fit.determined[column]:
            windows_used = int(np.count_nonzero(overlaps_s[fit.rows, column]))
            options[key] = _option(key, groups[key], fit.powers_w[column], fit.errors_w[column], windows_used)
    regressed = p_block_w is None and fit.powers_w.size > len(fit_keys) and bool(fit.determined[-1])
    if not regressed:
        return StageEstimate(options, p_block_w, fit.windows)
    return StageEstimate(options, float(fit.powers_w[-1]), fit.windows, float(fit.errors_w[-1]), True)


def _group_times(intervals: Sequence[Interval], origin_ns: int) -> dict[GroupKey, _GroupTimes]:
    """Intervals per (key, clock), sorted by start, with time outliers marked."""
    bounds: dict[GroupKey, list[tuple[int, int]]] = {}
    for interval in intervals:
        if interval.end_ns >= interval.start_ns:
            bounds.setdefault((interval.key, interval.clock_mhz), []).append(
                (interval.start_ns - origin_ns, interval.end_ns - origin_ns)
            )
    groups: dict[GroupKey, _GroupTimes] = {}
    for key, pairs in bounds.items():
        array = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
        durations = (array[:, 1] - array[:, 0]).astype(np.float64)
        groups[key] = _GroupTimes(array[:, 0], array[:, 1], _inliers(durations))
    return groups


def _inliers(durations: FloatArray) -> npt.NDArray[np.bool_]:
    """Durations within 3.5 scaled MADs of the median (or within 2 % of it)."""
    median = float(np.median(durations))
    spread = MAD_TO_SIGMA * float(np.median(np.abs(durations - median)))
    limit = max(OUTLIER_MADS * spread, _MIN_RELATIVE_SPREAD * median)
    return np.asarray(np.abs(durations - median) <= limit)


def _usable_windows(
    samples: Sequence[CounterSample], groups: dict[GroupKey, _GroupTimes], origin_ns: int
) -> _Windows:
    """The counter windows the fit may use (see the module docstring for what is dropped and why)."""
    ordered = sorted(samples, key=lambda s: s.t_ns)
    times = np.array([s.t_ns - origin_ns for s in ordered], dtype=np.int64)
    energy_mj = np.array([s.energy_mj for s in ordered], dtype=np.int64)
    if times.size < 3:
        return _Windows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    windows = _Windows(times[1:-1], times[2:], np.diff(energy_mj)[1:].astype(np.float64) / 1000.0)
    durations_ns = windows.ends_ns - windows.starts_ns
    keep = (durations_ns > 0) & (windows.energy_j > 0)
    if np.any(keep):
        gap = durations_ns > _GAP_FACTOR * float(np.median(durations_ns[keep]))
        keep &= ~gap & ~np.concatenate(([False], gap[:-1]))
    span_start = min(int(g.starts_ns[0]) for g in groups.values())
    span_end = max(int(g.ends_ns.max()) for g in groups.values())
    keep &= (windows.ends_ns > span_start) & (windows.starts_ns < span_end)
    starts_ns = np.sort(np.concatenate([g.starts_ns for g in groups.values()]))
    for group in groups.values():
        outliers = ~group.kept & ~_followed(group.ends_ns, starts_ns)
        if np.any(outliers):
            keep &= _overlap_s(windows, group.starts_ns[outliers], group.ends_ns[outliers]) <= 0
    return windows.select(keep)


def _followed(ends_ns: IntArray, starts_ns: IntArray) -> npt.NDArray[np.bool_]:
    """Which intervals ending at `ends_ns` another interval (of `starts_ns`, sorted) begins right after.

    A long interval followed at once by the next computation hides no idle time: the GPU was busy to its end
    and on (a late end event delays the next begin too, as events are sent in order), so the windows over it
    stay; only a long interval followed by idle time may have swallowed some of it."""
    after = np.searchsorted(starts_ns, ends_ns, side="left")
    next_ns = starts_ns[np.minimum(after, starts_ns.size - 1)]
    return (after < starts_ns.size) & (next_ns - ends_ns <= _BACK_TO_BACK_NS)


def _overlap_matrix(
    windows: _Windows, groups: dict[GroupKey, _GroupTimes]
) -> tuple[list[GroupKey], FloatArray]:
    """Per group that some window overlaps: its busy time in each window (s), one column per group."""
    keys: list[GroupKey] = []
    columns: list[FloatArray] = []
    for key in sorted(groups):
        column = _overlap_s(windows, groups[key].starts_ns, groups[key].ends_ns)
        if np.any(column > 0):
            keys.append(key)
            columns.append(column)
    if not columns:
        return keys, np.zeros((windows.energy_j.size, 0))
    return keys, np.column_stack(columns)


def _overlap_s(windows: _Windows, starts_ns: IntArray, ends_ns: IntArray) -> FloatArray:
    """Total overlap (s) of the intervals [starts, ends) with each window, exactly, in O((W + I) log I)."""
    order_start = np.sort(starts_ns)
    order_end = np.sort(ends_ns)
    cum_start = np.concatenate(([0], np.cumsum(order_start)))
    cum_end = np.concatenate(([0], np.cumsum(order_end)))

    def busy_until(t_ns: IntArray) -> IntArray:
        started = np.searchsorted(order_start, t_ns, side="right")
        ended = np.searchsorted(order_end, t_ns, side="right")
        return np.asarray(started * t_ns - cum_start[started] - (ended * t_ns - cum_end[ended]))

    return (busy_until(windows.ends_ns) - busy_until(windows.starts_ns)).astype(np.float64) / _NS_PER_S


def _fit_powers(
    windows: _Windows, overlaps_s: FloatArray, p_block_w: float | None, clocks_mhz: list[int]
) -> Fit | None:
    """The groups' powers (and P_block unless given), outlying windows dropped, groups at one clock tied by
    the prior (`_with_same_clock_prior`); None: unsolvable. `clocks_mhz`: each column's clock."""
    durations_s = windows.durations_s
    if overlaps_s.shape[1] == 0 or durations_s.size == 0:
        return None
    idle_s = np.maximum(durations_s - overlaps_s.sum(axis=1), 0.0)
    target_j = windows.energy_j.copy()
    design = overlaps_s
    if p_block_w is None:
        if np.any(idle_s > 0):
            design = np.column_stack((overlaps_s, idle_s))
    else:
        target_j = target_j - p_block_w * idle_s
    fit = robust_fit(design, target_j, 1.0 / windows.energy_j)
    if fit is None:
        return None
    return with_same_clock_prior(fit, design, target_j, 1.0 / windows.energy_j, clocks_mhz)


def _option(
    key: GroupKey, times: _GroupTimes, power_w: float, power_err_w: float, windows: int
) -> OptionEstimate:
    time_s = times.mean_time_s()
    time_rel_err = times.time_rel_err()
    power_rel_err = power_err_w / power_w if power_w > 0 else math.inf
    return OptionEstimate(
        key=key[0],
        clock_mhz=key[1],
        count=int(times.kept.sum()),
        time_s=time_s,
        energy_j=power_w * time_s,
        time_rel_err=time_rel_err,
        energy_rel_err=math.hypot(power_rel_err, time_rel_err),
        windows=windows,
    )


def segment_stand_in_w(first_w: float | None, measured_above_w: Iterable[float]) -> float | None:
    """The blocking power a segment stands in where its own idle time cannot pin it down (`estimate_segment`'s
    `stand_in_w`): the least that a segment of the GPU at a higher clock measured, else the first segment's
    (`first_w`: measured, or a nominal share; None for the first segment itself). Idle power falls with the
    clock and segments run from the highest clock down, so it is the closest upper bound measured: an H100
    waits at 130 W at 1980 MHz and 79 W at 900, and the first segment's 130 W standing in at 1020 MHz fitted
    the computations' energies as if their waits drew 40 W more than the board's."""
    return min(measured_above_w, default=first_w)


def estimate_segment(
    intervals: Sequence[Interval],
    samples: Sequence[CounterSample],
    *,
    blind: Sequence[tuple[int, int]] = (),
    fallback_p_block_w: float | None = None,
    stand_in_w: float | None = None,
) -> StageEstimate:
    """One clock's segment of online profiling: `estimate_stage` with the blocking power regressed for this
    segment (a GPU idles at a power that follows its locked clock: an H100 draws 130 W at 1980 MHz, 79 W at
    900), unless the segment's idle time cannot pin it down: none at all, or so little that its standard
    error exceeds `P_BLOCK_MAX_REL_ERR` of the reference. The reference is `fallback_p_block_w` (the first
    segment's), or for the first segment `NOMINAL_IDLE_SHARE` of its computations' least power; a segment
    that cannot pin its own down uses `stand_in_w` (`segment_stand_in_w`: the least measured above it)
    where given, else the reference. Why: a one-stage job's computations run back to back; on an H200,
    1.5-3 % idle time gave regressed blocking powers of 0 to 8,700 W, and through them computations'
    energies 20-57 % off. Two bounds hold whatever the windows say: segments run from the highest clock
    down and idle power falls with the clock, so a segment's blocking power is at most the first segment's
    (not the least measured above: one noisy low measurement would then cap every segment below it); and it
    is at most the least power of the segment's computations (an idle GPU draws less than a busy one)."""
    current = estimate_stage(intervals, samples, blind=blind)
    busy_w = [o.energy_j / o.time_s for o in current.options.values() if o.time_s > 0 and o.energy_j > 0]
    reference_w = fallback_p_block_w
    if reference_w is None and busy_w:
        reference_w = NOMINAL_IDLE_SHARE * min(busy_w)
    p_block_w = current.p_block_w
    if reference_w is not None and (
        p_block_w is None or not current.p_block_err_w <= P_BLOCK_MAX_REL_ERR * reference_w
    ):
        p_block_w = stand_in_w if stand_in_w is not None else reference_w
    if p_block_w is not None and fallback_p_block_w is not None:
        p_block_w = min(p_block_w, fallback_p_block_w)
    if p_block_w is not None and busy_w:
        p_block_w = min(p_block_w, *busy_w)
    if p_block_w is None or p_block_w == current.p_block_w:
        return current
    return estimate_stage(intervals, samples, p_block_w=p_block_w, blind=blind)

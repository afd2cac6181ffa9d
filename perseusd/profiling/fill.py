"""Options at the clocks a sparse sweep did not visit, from local curves through the ones it did.

The sweep measures a handful of clocks per key (~200 MHz apart on an H100 job), and a plan can only use what
the profile holds: a sweep that happened to visit 1215 and 1440 MHz gives a coarser plan than one that
visited 1305 and 1395 too, and two runs of one job differ by which clocks their sweeps visited. So, per key,
between two neighbouring measured clocks (below the highest), every supported clock gets an option from the
physics of a locked clock, through both neighbours:

- time `a + b / f` (a part that does not scale with the SM clock, a part that does);
- power linear in `f`; energy = time x power.

A global curve over all of a key's clocks does not work on a real GPU: the H100's time is flat over the
power-capped top and wiggles by 2-5 % between clocks 150 MHz apart. The local curves are **trusted** for a
key when each inner measured clock lies within `LOO_ENERGY_MAX` (energy) and `LOO_TIME_MAX` (time) of the
curve through its two neighbours (leave one out, over a gap twice as wide as the ones filled), beyond what
the three measurements' own errors explain, with at least `MIN_CLOCKS` measured clocks below the highest.
A filled option's standard error is the larger of its two neighbours' combined with half the leave-one-out RMS
(so the do-no-harm rule and the job's reported error carry it). Nothing is extrapolated, and nothing is filled
between the highest measured clock and the next: on a power-capped GPU the highest clock's label is not the
clock it ran (the sweep skips the capped range), and all-max is the highest clock itself. A key whose curves
are not trusted, or that has fewer clocks, fills nothing: that key plans with its measured clocks only, as
before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perseusd.profiling.estimator import OptionEstimate, StageEstimate
from perseusd.profiling.sweep import pareto_options
from perseusd.profiling.trace import OptionKey

MIN_CLOCKS = 3
"""Measured clocks (below the highest) a key needs for the leave-one-out test."""
LOO_ENERGY_MAX = 0.08
"""Trust the curves when each inner measured clock's energy lies within this of the curve through its two
neighbours (a gap twice as wide as the ones filled: on smooth curves the filled clocks lie 2-4 times closer,
so this bounds their error near 2-4 %; docs/profiling.md)."""
LOO_TIME_MAX = 0.06
NOISE_SIGMAS = 2.0
"""A leave-one-out miss is counted beyond this many standard errors of what the three measured options' own
errors explain: a measured clock 1.5 % off its truth fakes a 1.5-2 % bend (docs/profiling.md)."""
ENERGY_ERR_FLOOR = 0.02
"""The least relative standard error the test takes a measured option's energy to have. The counter fit's
own standard errors claim under 0.75 % (the sweep measures a clock until they do), but in the closed loop
a key's measured energies lie 2.0 % (standard deviation about the key's own offset) from the board's truth:
1,804 options of 27 runs, 9 workloads of the family, 3 seeds (docs/profiling.md)."""


def _between(low: OptionEstimate, high: OptionEstimate, clock_mhz: int) -> tuple[float, float]:
    """(time s, energy J) at `clock_mhz` between two measured clocks: time `a + b / f` and power linear in
    `f`, each through both."""
    f1, f2 = low.clock_mhz, high.clock_mhz
    b = (low.time_s - high.time_s) / (1 / f1 - 1 / f2)
    a = high.time_s - b / f2
    p1, p2 = low.energy_j / low.time_s, high.energy_j / high.time_s
    time_s = a + b / clock_mhz
    power_w = p1 + (p2 - p1) * (clock_mhz - f1) / (f2 - f1)
    return time_s, time_s * power_w


@dataclass(frozen=True)
class KeyFit:
    """How well one key's measured clocks follow the local curves (`_between`) and whether to trust them."""

    clocks_mhz: tuple[int, ...]
    """The measured clocks below the highest, ascending."""
    loo_energy: tuple[float, ...]
    """At each inner measured clock: the relative energy error of the curve through its two neighbours."""
    loo_time: tuple[float, ...]
    model_rel_err: float
    """The standard error the local curve adds at a clock between two measured ones: half the RMS of
    `loo_energy` (a gap half as wide as the test's)."""
    trusted: bool
    why: str
    """Why not trusted ("" when trusted)."""


def _noise(low: OptionEstimate, mid: OptionEstimate, high: OptionEstimate, energy: bool) -> float:
    """The relative standard error of a leave-one-out miss at `mid` that the three options' own errors
    explain: `mid`'s, and its neighbours' weighted as the curve through them weights them there (energy
    errors at least `ENERGY_ERR_FLOOR`)."""
    w = (high.clock_mhz - mid.clock_mhz) / (high.clock_mhz - low.clock_mhz)
    errs = [max(o.energy_rel_err, ENERGY_ERR_FLOOR) if energy else o.time_rel_err for o in (mid, low, high)]
    return math.sqrt(errs[0] ** 2 + (w * errs[1]) ** 2 + ((1 - w) * errs[2]) ** 2)


def fit_key(measured: Sequence[OptionEstimate]) -> KeyFit | None:
    """The leave-one-out test of one key's measured options below its highest clock (None: fewer than
    `MIN_CLOCKS`). A miss counts beyond `NOISE_SIGMAS` standard errors of what the measurements' own errors
    explain (`_noise`)."""
    ordered = sorted(measured, key=lambda o: o.clock_mhz)[:-1]
    points = [o for o in ordered if o.time_s > 0 and o.energy_j > 0 and math.isfinite(o.energy_j)]
    if len(points) < MIN_CLOCKS:
        return None
    loo_e, loo_t, misses_e, misses_t = [], [], [], []
    for low, mid, high in zip(points, points[1:], points[2:], strict=False):
        time_s, energy_j = _between(low, high, mid.clock_mhz)
        loo_t.append(time_s / mid.time_s - 1)
        loo_e.append(energy_j / mid.energy_j - 1)
        misses_t.append((abs(loo_t[-1]), NOISE_SIGMAS * _noise(low, mid, high, energy=False)))
        misses_e.append((abs(loo_e[-1]), NOISE_SIGMAS * _noise(low, mid, high, energy=True)))
    model = math.sqrt(sum(e * e for e in loo_e) / len(loo_e)) / 2
    why = ""
    worst_t = max(misses_t, key=lambda x: x[0] - x[1])
    worst_e = max(misses_e, key=lambda x: x[0] - x[1])
    if worst_t[0] - worst_t[1] > LOO_TIME_MAX:
        why = f"time between measured clocks {_miss(worst_t, LOO_TIME_MAX)}"
    elif worst_e[0] - worst_e[1] > LOO_ENERGY_MAX:
        why = f"energy between measured clocks {_miss(worst_e, LOO_ENERGY_MAX)}"
    clocks = tuple(o.clock_mhz for o in points)
    return KeyFit(clocks, tuple(loo_e), tuple(loo_t), model, not why, why)


def _miss(miss: tuple[float, float], limit: float) -> str:
    """`9.5% off (over 8% + 1.8% noise)`."""
    return f"{miss[0]:.1%} off (over {limit:.0%} + {miss[1]:.1%} noise)"


def fitted_options(
    measured: Sequence[OptionEstimate], supported_mhz: Iterable[int], fit: KeyFit | None = None
) -> list[OptionEstimate]:
    """One key's options at the supported clocks between its measured clocks (below the highest) that it
    did not measure (empty when the test is missing or failed); `fit`: `fit_key(measured)` if computed."""
    fit = fit_key(measured) if fit is None else fit
    if fit is None or not fit.trusted:
        return []
    by_clock = {o.clock_mhz: o for o in measured if o.clock_mhz in fit.clocks_mhz}
    low, high = fit.clocks_mhz[0], fit.clocks_mhz[-1]
    out = []
    for clock in sorted(set(supported_mhz)):
        if not low < clock < high or clock in by_clock:
            continue
        below = by_clock[max(c for c in by_clock if c < clock)]
        above = by_clock[min(c for c in by_clock if c > clock)]
        time_s, energy_j = _between(below, above, clock)
        if not above.time_s <= time_s <= below.time_s or not energy_j > 0:
            continue  # never faster than a higher clock nor slower than a lower one
        err = max(below.energy_rel_err, above.energy_rel_err)
        out.append(
            OptionEstimate(
                key=below.key,
                clock_mhz=clock,
                count=min(below.count, above.count),
                time_s=time_s,
                energy_j=energy_j,
                time_rel_err=max(below.time_rel_err, above.time_rel_err),
                energy_rel_err=math.hypot(err, fit.model_rel_err),
                windows=0,
                fitted=True,
            )
        )
    return out


def fill_stage(
    estimate: StageEstimate,
    sweep_clocks_mhz: Sequence[int],
    supported_mhz: Sequence[int],
    kept: Sequence[OptionEstimate],
    waiting_w: float = 0.0,
    top_aside: bool = False,
) -> tuple[list[OptionEstimate], list[str]]:
    """One GPU's `kept` options (the sweep's Pareto options) with every key's fitted options added and the
    Pareto filter (`pareto_options` at `waiting_w`, with `top_aside`) applied again (`kept`'s options that
    are not Pareto-optimal, such as the highest clock kept for all-max, stay); and per key what was done,
    for the log."""
    clocks = set(sweep_clocks_mhz)
    by_key: dict[OptionKey, list[OptionEstimate]] = {}
    for (key, clock), option in estimate.options.items():
        if clock in clocks:
            by_key.setdefault(key, []).append(option)
    notes: list[str] = []
    out: list[OptionEstimate] = []
    for key in sorted({o.key for o in kept}):
        mine = [o for o in kept if o.key == key]
        fit = fit_key(by_key.get(key, []))
        added = fitted_options(by_key.get(key, []), supported_mhz, fit)
        name = f"{key[0]}/{key[1]}"
        if fit is None:
            notes.append(f"{name} measured clocks only (under {MIN_CLOCKS} below the highest)")
        elif not fit.trusted:
            notes.append(f"{name} measured clocks only (fit not trusted: {fit.why})")
        else:
            notes.append(f"{name} +{len(added)} fitted clocks (model error {fit.model_rel_err:.1%})")
        front = {(o.clock_mhz) for o in pareto_options([*mine, *added], waiting_w, top_aside)}
        out.extend(o for o in [*mine, *added] if o.clock_mhz in front or not o.fitted)
    return out, notes

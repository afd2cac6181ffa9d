"""A computation's time and power below the lowest clock it was profiled at, fitted on its profiled clocks.

A power limit can drive a GPU below the lowest clock a profile measured (900 MHz for the shipped H100 GPT
profile; the H100 goes down to 345 MHz). Below it, for each computation:

- time ~ a + b / f: a least-squares fit on its profiled clocks (a is the part that does not scale with the
  clock, memory-bound work; a >= 0, b > 0, else time ~ 1 / f);
- power ~ p_static + c * f^k: p_static is the GPU's blocking power (what it draws doing nothing), k a
  least-squares fit of log(power - p_static) on log f over the profiled clocks, within [1, 3] (dynamic power
  goes as f * V^2, the voltage falling with the clock);

both scaled to meet the lowest profiled clock's measured cost, so the costs are continuous there. Checked on
the shipped H100 profile against `power-limit-sweep.csv` (one stage's forward+backward under power limits
700...200 W on a real H100), with the board's capping (each computation at the highest clock whose power
fits): within 5 % of the measured time from 700 to 350 W (the profiled range), then +17-19 % at 300 W
(705-735 MHz against the measured 882 MHz), +10-11 % at 250 W and +3-7 % at 200 W; energy +17-18 %, +6-8 %,
+2-5 %. The error at 300 W is the profile's: its 900 MHz rows (locked clock) draw 363 W, the capped H100
drew 297 W at 882 MHz. Before this fit, the board kept the lowest clock's power below it and ran the stage
at 345 MHz, +157 % at 300 W.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

K_MIN = 1.0
K_MAX = 3.0
K_DEFAULT = 2.0


def extrapolate_below(
    measured: Mapping[int, tuple[float, float]], clocks_mhz: Iterable[int], static_w: float
) -> dict[int, tuple[float, float]]:
    """(time s, energy J) at each of `clocks_mhz` below the lowest of `measured` ({clock MHz: (time s,
    energy J)}), see the module. Clocks at or above the lowest measured one are left out."""
    points = sorted((f, t, e / t) for f, (t, e) in measured.items() if t > 0 and f > 0)
    if not points:
        return {}
    low_mhz, low_s, low_w = points[0]
    a, b = _time_fit(points)
    k = _power_exponent(points, static_w)
    scale = low_s / (a + b / low_mhz)
    out = {}
    for clock in clocks_mhz:
        if 0 < clock < low_mhz:
            time_s = scale * (a + b / clock)
            power_w = low_w if low_w <= static_w else static_w + (low_w - static_w) * (clock / low_mhz) ** k
            out[clock] = (time_s, power_w * time_s)
    return out


def _time_fit(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(a, b) of time ~ a + b / f, least squares; (0, 1) (time ~ 1 / f) when the fit is not physical."""
    if len(points) < 2:
        return 0.0, 1.0
    xs = [1.0 / f for f, _, _ in points]
    ys = [t for _, t, _ in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    if var_x <= 0:
        return 0.0, 1.0
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var_x
    a = mean_y - b * mean_x
    if b <= 0:
        return 0.0, 1.0
    if a < 0:  # through the origin: time ~ b / f
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return a, b


def _power_exponent(points: list[tuple[int, float, float]], static_w: float) -> float:
    """k of power - p_static ~ f^k, least squares on logs, within [K_MIN, K_MAX]."""
    logs = [(math.log(f), math.log(p - static_w)) for f, _, p in points if p > static_w]
    if len(logs) < 2:
        return K_DEFAULT
    mean_x = sum(x for x, _ in logs) / len(logs)
    mean_y = sum(y for _, y in logs) / len(logs)
    var_x = sum((x - mean_x) ** 2 for x, _ in logs)
    if var_x <= 0:
        return K_DEFAULT
    k = sum((x - mean_x) * (y - mean_y) for x, y in logs) / var_x
    return min(K_MAX, max(K_MIN, k))

"""Node power measured from the energy counters, averaged over the enforcement window.

Samples are (time, each GPU's counter in J). The window's power is the energy every GPU's counter moved
between the newest sample and the oldest one at least a window before it, over that time; a GPU missing
from either sample is left out of that window (and the reading says how many GPUs it covers).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPower:
    power_w: float
    span_s: float
    gpus: int


class PowerWindow:
    """A bounded history of energy-counter samples (see the module)."""

    def __init__(self, window_s: float, keep_s: float | None = None) -> None:
        if not window_s > 0:
            raise ValueError("the enforcement window must be > 0 s")
        self.window_s = window_s
        self._keep_s = keep_s if keep_s is not None else 4 * window_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, t_s: float, energy_j: Mapping[str, float]) -> None:
        if self._samples and t_s <= self._samples[-1][0]:
            return
        self._samples.append((t_s, dict(energy_j)))
        while len(self._samples) > 2 and t_s - self._samples[1][0] >= self._keep_s:
            self._samples.popleft()

    def clear(self) -> None:
        self._samples.clear()

    def power(self, span_s: float | None = None) -> WindowPower | None:
        """The power over the newest window, or the newest `span_s` (None until it is covered)."""
        span_s = self.window_s if span_s is None else span_s
        if len(self._samples) < 2:
            return None
        end_s, end = self._samples[-1]
        start: tuple[float, dict[str, float]] | None = None
        for sample in reversed(self._samples):
            if end_s - sample[0] >= span_s:
                start = sample
                break
        if start is None:
            return None
        taken_s = end_s - start[0]
        moved = [end[g] - start[1][g] for g in end if g in start[1] and end[g] >= start[1][g]]
        return WindowPower(sum(moved) / taken_s, taken_s, len(moved))

"""A job's carbon so far: measured energy times the grid's intensity, and the same iterations at all-max.

Fed from the main loop with each GPU's energy counter (mJ) and its iterations run. Between two readings the
GPU's energy is counted at the intensity in use (the node's signal); while there is none the energy is
counted as `uncounted_energy_j` and no carbon is made up. The all-max figure is those iterations times the
GPU's all-max energy per iteration (measured by the counters during profiling, or the profile's prediction
for the job's all-max point spread over its stages), at the same intensity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

J_PER_KWH = 3.6e6


@dataclass
class _GpuMark:
    t_ns: int
    energy_mj: int
    steps: int


@dataclass
class CarbonLedger:
    """One job's running totals (grams of CO2eq, or money when the signal is a price per kWh)."""

    carbon_g: float = 0.0
    all_max_carbon_g: float = 0.0
    energy_j: float = 0.0
    uncounted_energy_j: float = 0.0
    all_max_basis: str = ""
    """"measured", "predicted" or "" (no all-max figure for some GPU: `all_max_carbon_g` is not whole)."""
    _marks: dict[str, _GpuMark] = field(default_factory=dict)

    def last_read_ns(self, gpu: str) -> int:
        """When the GPU's last reading was taken (0: none yet)."""
        mark = self._marks.get(gpu)
        return 0 if mark is None else mark.t_ns

    def observe(
        self, gpu: str, reading: tuple[int, int], steps: int, all_max_j: float | None, intensity: float | None
    ) -> None:
        """The GPU's counter reading (t_ns, mJ) and iterations now; `all_max_j`: its all-max energy per
        iteration (None: unknown); `intensity`: per kWh (None: no usable signal)."""
        t_ns, energy_mj = reading
        mark = self._marks.get(gpu)
        if mark is not None and t_ns <= mark.t_ns and steps == mark.steps:
            return  # nothing new
        self._marks[gpu] = _GpuMark(t_ns, energy_mj, steps)
        if mark is None or energy_mj < mark.energy_mj or steps < mark.steps:
            return  # the first reading, or the counter or the step count started over
        energy_j = (energy_mj - mark.energy_mj) / 1000.0
        if intensity is None:
            self.uncounted_energy_j += energy_j
            return
        self.energy_j += energy_j
        self.carbon_g += energy_j / J_PER_KWH * intensity
        if all_max_j is not None:
            self.all_max_carbon_g += (steps - mark.steps) * all_max_j / J_PER_KWH * intensity

    def forget(self, gpu: str) -> None:
        self._marks.pop(gpu, None)

"""GPU models for the simulated backend, each built from a real measured profile bundled with Perseus.

A profile (`perseusd/data/profiles/*.csv`, columns stage,instruction,frequency,time,energy; time in s,
energy in J) gives, for each pipeline stage and instruction (forward/backward), the time and energy of one
computation at every SM clock. The supported clocks of a simulated GPU are the clocks of its profile.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from importlib import resources

from perseusd.gpu.errors import GpuInvalidArgumentError


@dataclass(frozen=True)
class ComputationCost:
    """Time (s) and energy (J) of one computation at one clock."""

    time_s: float
    energy_j: float

    @property
    def power_w(self) -> float:
        """Average busy power (W)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class ModelSpec:
    """Board facts of a simulated GPU model that the profile does not contain."""

    name: str
    gpu_name: str
    profile_file: str
    power_limit_min_w: float
    power_limit_max_w: float
    blocking_power_w: float


MODEL_SPECS: dict[str, ModelSpec] = {
    "a100_sxm": ModelSpec(
        name="a100_sxm",
        gpu_name="NVIDIA A100-SXM4-80GB (simulated)",
        profile_file="gpt3-175b+a100_sxm_bf16.csv",
        power_limit_min_w=100.0,
        power_limit_max_w=400.0,
        blocking_power_w=83.64,
    ),
    "a40": ModelSpec(
        name="a40",
        gpu_name="NVIDIA A40 (simulated)",
        profile_file="gpt3-175b+a40_bf16.csv",
        power_limit_min_w=100.0,
        power_limit_max_w=300.0,
        blocking_power_w=70.38,
    ),
}
"""The simulated models by name (`--sim-model`)."""


@dataclass(frozen=True)
class SimModel:
    """A simulated GPU model: board facts plus the measured cost of every computation at every clock."""

    spec: ModelSpec
    costs: dict[tuple[int, str], dict[int, ComputationCost]] = field(repr=False, hash=False)
    """(stage, instruction) -> clock (MHz) -> cost."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def clocks_mhz(self) -> tuple[int, ...]:
        """Supported SM clocks (MHz), highest first: every clock of the profile."""
        clocks = {clock for by_clock in self.costs.values() for clock in by_clock}
        return tuple(sorted(clocks, reverse=True))

    def cost(self, stage: int, instruction: str, clock_mhz: int) -> ComputationCost:
        """The measured cost of one computation at a clock of the profile."""
        by_clock = self.costs.get((stage, instruction))
        if by_clock is None:
            raise GpuInvalidArgumentError(
                f"model {self.name} has no profile for stage {stage} {instruction!r}", op="run"
            )
        found = by_clock.get(clock_mhz)
        if found is None:
            raise GpuInvalidArgumentError(f"model {self.name} has no profile at {clock_mhz} MHz", op="run")
        return found


def parse_profile(text: str, source: str) -> dict[tuple[int, str], dict[int, ComputationCost]]:
    """Parse a profile CSV. Raises `GpuInvalidArgumentError` naming `source` and the line on bad input."""
    costs: dict[tuple[int, str], dict[int, ComputationCost]] = {}
    reader = csv.DictReader(io.StringIO(text))
    for row in reader:
        try:
            key = (int(row["stage"]), row["instruction"].strip())
            cost = ComputationCost(time_s=float(row["time"]), energy_j=float(row["energy"]))
            costs.setdefault(key, {})[int(row["frequency"])] = cost
        except (KeyError, ValueError, TypeError, AttributeError) as error:
            raise GpuInvalidArgumentError(
                f"{source}:{reader.line_num}: malformed profile row ({error})", op="load_profile"
            ) from error
    if not costs:
        raise GpuInvalidArgumentError(f"{source}: empty profile", op="load_profile")
    return costs


def load_sim_model(name: str) -> SimModel:
    """The simulated model `name` (one of `MODEL_SPECS`), read from its bundled profile."""
    spec = MODEL_SPECS.get(name)
    if spec is None:
        known = ", ".join(sorted(MODEL_SPECS))
        raise GpuInvalidArgumentError(f"unknown sim model {name!r} (known: {known})", op="load_profile")
    path = resources.files("perseusd") / "data" / "profiles" / spec.profile_file
    return SimModel(spec=spec, costs=parse_profile(path.read_text(encoding="utf-8"), spec.profile_file))

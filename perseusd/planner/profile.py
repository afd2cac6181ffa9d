"""Measured computation profiles: time and energy of each (stage, instruction) at each SM clock.

This module is the data model only; reading and writing the CSV format shared with Zeus
(`stage,instruction,frequency,time,energy`) with validation lives in `perseusd.planner.profile_csv`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from perseusd.errors import PlanningError
from perseusd.planner.dag import Instruction


@dataclass(frozen=True)
class Measurement:
    """One profile row: one execution of `instruction` on `stage` at `freq_mhz`."""

    stage: int
    instruction: Instruction
    freq_mhz: int
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class Profile:
    """An immutable set of measurements, kept in input order. `source` names where it came from."""

    measurements: tuple[Measurement, ...]
    source: str = "<memory>"
    _index: dict[tuple[int, Instruction], tuple[Measurement, ...]] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        index: dict[tuple[int, Instruction], list[Measurement]] = {}
        for m in self.measurements:
            index.setdefault((m.stage, m.instruction), []).append(m)
        object.__setattr__(self, "_index", {k: tuple(v) for k, v in index.items()})

    @classmethod
    def from_measurements(cls, measurements: Iterable[Measurement], source: str = "<memory>") -> Profile:
        """Build a profile from measurements (input order is kept)."""
        return cls(tuple(measurements), source)

    @property
    def num_stages(self) -> int:
        """Number of stages (stages are 0..S-1)."""
        return 1 + max((m.stage for m in self.measurements), default=-1)

    def options(self, stage: int, instruction: Instruction) -> tuple[Measurement, ...]:
        """All measurements of one (stage, instruction), in input order."""
        try:
            return self._index[(stage, instruction)]
        except KeyError:
            raise PlanningError(
                f"profile {self.source} has no {instruction.value} measurements for stage {stage}"
            ) from None

    def lookup(self, stage: int, instruction: Instruction, freq_mhz: int) -> Measurement:
        """The measurement of one (stage, instruction) at exactly `freq_mhz`."""
        for m in self.options(stage, instruction):
            if m.freq_mhz == freq_mhz:
                return m
        raise PlanningError(
            f"profile {self.source} has no {instruction.value} of stage {stage} at {freq_mhz} MHz"
        )

    def max_freq_mhz(self, stage: int, instruction: Instruction) -> int:
        """The highest clock measured for one (stage, instruction)."""
        return max(m.freq_mhz for m in self.options(stage, instruction))

    def frequencies_mhz(self) -> tuple[int, ...]:
        """Every clock that appears in the profile, highest first."""
        return tuple(sorted({m.freq_mhz for m in self.measurements}, reverse=True))

    def digest(self) -> str:
        """A content digest (sha256 over the rows in canonical order), independent of row order and source."""
        rows = sorted(
            f"{m.stage},{m.instruction.value},{m.freq_mhz},{m.time_s!r},{m.energy_j!r}"
            for m in self.measurements
        )
        return "sha256:" + hashlib.sha256("\n".join(rows).encode()).hexdigest()

    def scaled(self, time_factor: float = 1.0, energy_factor: float = 1.0) -> Profile:
        """The same profile in other units (e.g. ms instead of s: time_factor=1000)."""
        return Profile(
            tuple(
                Measurement(
                    m.stage, m.instruction, m.freq_mhz, m.time_s * time_factor, m.energy_j * energy_factor
                )
                for m in self.measurements
            ),
            self.source,
        )

    def with_split_backward(self, input_share: float = 0.5) -> Profile:
        """This profile plus, for each stage measured with whole backwards only, the backward's two halves
        (zero-bubble schedules): `input_share` of its time and energy as `backward_input`, the rest as
        `backward_weight`. For a transformer layer the two are about equal (Qi et al., Zero Bubble Pipeline
        Parallelism, 2024), hence the default; a profile that measured them keeps its own."""
        if not 0.0 < input_share < 1.0:
            raise PlanningError(f"input_share must be in (0, 1) (got {input_share})")
        halves = (Instruction.BACKWARD_INPUT, Instruction.BACKWARD_WEIGHT)
        measured = {m.stage for m in self.measurements if m.instruction in halves}
        added = [
            Measurement(m.stage, instruction, m.freq_mhz, m.time_s * share, m.energy_j * share)
            for m in self.measurements
            if m.instruction is Instruction.BACKWARD and m.stage not in measured
            for instruction, share in zip(halves, (input_share, 1.0 - input_share), strict=True)
        ]
        return Profile((*self.measurements, *added), self.source) if added else self

"""Who runs what and who waits for whom: per-stage orders and the neighbours of each computation.

A pipeline has S GPUs (stage processes), each running C model chunks; chunk c of GPU s is virtual stage
v = c * S + s, which draws profile stage v. Forward of microbatch m on virtual stage v waits for the forward
of m on v - 1, backward of m on v waits for the backward of m on v + 1 (the DAG of `perseusd.planner.dag`).
With C > 1 the neighbours wrap around: GPU 0's chunk c + 1 follows GPU S - 1's chunk c.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseusd.planner.dag import Instruction, ScheduleStep
from perseusd.planner.schedules import OBSERVED, WIRE_NAMES, spec_of

SCHEDULES = WIRE_NAMES
"""`--schedule` values; "observed" runs 1F1B orders but lets the daemon learn the order from events."""


@dataclass(frozen=True)
class Neighbour:
    """A computation on another GPU of the same pipeline: pipeline-local GPU index and model chunk."""

    gpu_stage: int
    chunk: int


@dataclass(frozen=True)
class PipelineShape:
    """The shape of one pipeline: stages (GPUs), microbatches, chunks per GPU and the schedule name."""

    num_stages: int
    num_microbatches: int
    num_chunks: int
    schedule: str

    @property
    def num_virtual_stages(self) -> int:
        """Model stages of the pipeline (the profile stages it draws)."""
        return self.num_stages * self.num_chunks

    def order(self, stage: int) -> list[ScheduleStep]:
        """The computations GPU `stage` runs in one iteration, in order."""
        spec = spec_of("1f1b" if self.schedule == OBSERVED else self.schedule)
        return spec.order(self.num_stages, self.num_microbatches, self.num_chunks, stage)

    def profile_stage(self, stage: int, chunk: int) -> int:
        """The profile stage whose costs chunk `chunk` of GPU `stage` draws."""
        return chunk * self.num_stages + stage

    def _at(self, virtual_stage: int) -> Neighbour | None:
        if 0 <= virtual_stage < self.num_virtual_stages:
            return Neighbour(virtual_stage % self.num_stages, virtual_stage // self.num_stages)
        return None

    def source(self, stage: int, instruction: Instruction, chunk: int) -> Neighbour | None:
        """The computation this one waits for (same microbatch), or None at the pipeline's ends."""
        step = -1 if instruction is Instruction.FORWARD else 1
        return self._at(self.profile_stage(stage, chunk) + step)

    def destination(self, stage: int, instruction: Instruction, chunk: int) -> Neighbour | None:
        """The computation that waits for this one (same microbatch), or None at the pipeline's ends."""
        step = 1 if instruction is Instruction.FORWARD else -1
        return self._at(self.profile_stage(stage, chunk) + step)

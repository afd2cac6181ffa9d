"""Who runs what and who waits for whom: per-stage orders and the neighbours of each computation.

A pipeline has S GPUs (stage processes), each running C model chunks; chunk c of GPU s draws profile stage
c * S + s and sits at the model stage its schedule's layout says (`perseusd.planner.schedules.model_stage`:
c * S + s, or 2 S - 1 - s for chunk 1 of a V). Forward of microbatch m on model stage v waits for the forward
of m on v - 1, backward (or input gradient) of m on v waits for the one of m on v + 1 (the DAG of
`perseusd.planner.dag`); a weight gradient waits only for its own input gradient, on the same GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from perseusd.planner.dag import Instruction, ScheduleStep
from perseusd.planner.schedules import OBSERVED, WIRE_NAMES, Layout, layout_of, model_stage, spec_of

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
    def split_backward(self) -> bool:
        """Its backwards run as input and weight gradients (zero-bubble schedules)."""
        return self.schedule != OBSERVED and spec_of(self.schedule).split_backward

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

    @property
    def _layout(self) -> Layout:
        return layout_of(self.schedule)

    @cached_property
    def _placed(self) -> dict[int, Neighbour]:
        """Model stage -> the GPU and chunk that run it."""
        return {
            model_stage(self._layout, self.num_stages, s, c): Neighbour(s, c)
            for s in range(self.num_stages)
            for c in range(self.num_chunks)
        }

    def _next(self, stage: int, instruction: Instruction, chunk: int, step: int) -> Neighbour | None:
        if instruction is Instruction.BACKWARD_WEIGHT:
            return None
        if instruction is not Instruction.FORWARD:
            step = -step
        return self._placed.get(model_stage(self._layout, self.num_stages, stage, chunk) + step)

    def source(self, stage: int, instruction: Instruction, chunk: int) -> Neighbour | None:
        """The computation this one waits for (same microbatch), or None at the pipeline's ends."""
        return self._next(stage, instruction, chunk, -1)

    def destination(self, stage: int, instruction: Instruction, chunk: int) -> Neighbour | None:
        """The computation that waits for this one (same microbatch), or None at the pipeline's ends."""
        return self._next(stage, instruction, chunk, 1)

"""What the emulator's processes tell each other (pickled over `multiprocessing` queues).

Between neighbouring stages: `Activation` (a dependency is satisfied) and `IterationStart` (the pipeline's
first stage began an iteration and passes the coordinator's command down the pipeline, so every stage applies
it at the same iteration). From the coordinator to a pipeline's first stage: `Command`. From stages to the
coordinator: the `Report` types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

CommandKind: TypeAlias = Literal["start", "register", "running", "stop"]


@dataclass(frozen=True)
class Activation:
    """Computation (`instruction`, `microbatch`, `chunk`) of the receiver may run in `iteration`."""

    iteration: int
    instruction: str
    microbatch: int
    chunk: int


@dataclass(frozen=True)
class IterationStart:
    """The pipeline starts `iteration`; `command` ("" for none) applies from this iteration on, and every
    stage runs the iteration's computations `throttle` times longer (an emulated straggler)."""

    iteration: int
    command: str
    throttle: float = 1.0


@dataclass(frozen=True)
class Command:
    """From the coordinator: start training, register with the daemon, stop; or "running": the job runs its
    plan from iteration `after_iteration` on (the straggler's closed-loop window counts from there).

    A first stage applies "register" and "stop" at the first iteration start after `after_iteration` (a stop
    never cuts an iteration the coordinator still measures), "running" as soon as it reads it.
    """

    kind: CommandKind
    after_iteration: int = -1


@dataclass(frozen=True)
class StageReady:
    """The stage holds its GPU at the maximum clock and waits for "start"."""

    pipeline: int
    stage: int


@dataclass(frozen=True)
class StageFailed:
    pipeline: int
    stage: int
    message: str


@dataclass(frozen=True)
class IterationBegan:
    """The first stage of `pipeline` began `iteration` at `start_s` (CLOCK_MONOTONIC) with `command`."""

    pipeline: int
    iteration: int
    start_s: float
    command: str


@dataclass(frozen=True)
class Registered:
    """The daemon accepted the stage into the job; `state` and `cached` are from its reply."""

    pipeline: int
    stage: int
    state: str
    cached: bool


@dataclass(frozen=True)
class StageDone:
    """The stage stopped and released its GPU."""

    pipeline: int
    stage: int


Report: TypeAlias = StageReady | StageFailed | IterationBegan | Registered | StageDone

"""A job's shape (schedule, stages, microbatches, chunks), its DAG and its cache signature."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from perseus_client.protocol import Register

from perseusd.errors import InvalidValueError
from perseusd.planner.dag import ComputationDag, Instruction, ScheduleStep, build_dag, from_stage_orders
from perseusd.planner.schedules import OBSERVED, SCHEDULES, instructions_of

MAX_STAGES = 1024
MAX_MICROBATCHES = 4096
MAX_CHUNKS = 64
MAX_JOB_NAME = 128
MAX_PIPELINE = 1_000_000
MAX_STAGE_GPUS = 64
MAX_RUN = 128

StageOrder = tuple[ScheduleStep, ...]


@dataclass(frozen=True)
class JobShape:
    """What every process of a job must agree on."""

    schedule: str
    num_stages: int
    num_microbatches: int
    chunks: int
    stage_gpus: int = 1
    """GPUs per stage (tensor x context parallel): profiled, planned and switched as one stage."""

    @classmethod
    def of(cls, message: Register) -> JobShape:
        """The shape a registration declares; raises `InvalidValueError` when it cannot be right."""
        shape = cls(
            message.schedule, message.num_stages, message.num_microbatches, message.chunks, message.stage_gpus
        )
        shape.check(message)
        return shape

    def check(self, message: Register) -> None:
        def bad(problem: str) -> InvalidValueError:
            return InvalidValueError(problem, "")

        if not 0 < len(message.job) <= MAX_JOB_NAME or not message.job.isprintable():
            raise bad(f"job must be 1..{MAX_JOB_NAME} printable characters")
        if not 1 <= self.num_stages <= MAX_STAGES:
            raise bad(f"num_stages must be 1..{MAX_STAGES}")
        if not 1 <= self.num_microbatches <= MAX_MICROBATCHES:
            raise bad(f"num_microbatches must be 1..{MAX_MICROBATCHES}")
        if not 1 <= self.chunks <= MAX_CHUNKS:
            raise bad(f"chunks must be 1..{MAX_CHUNKS}")
        spec = SCHEDULES.get(self.schedule)
        problem = spec and spec.problem(self.num_stages, self.num_microbatches, self.chunks)
        if problem:
            raise bad(problem)
        if not 0 <= message.stage < self.num_stages:
            raise bad(f"stage {message.stage} outside 0..{self.num_stages - 1}")
        if not 0 <= message.pipeline <= MAX_PIPELINE:
            raise bad(f"pipeline must be 0..{MAX_PIPELINE}")
        if not 1 <= self.stage_gpus <= MAX_STAGE_GPUS:
            raise bad(f"stage_gpus must be 1..{MAX_STAGE_GPUS}")
        if len(message.run) > MAX_RUN or not message.run.isprintable():
            raise bad(f"run must be at most {MAX_RUN} printable characters")

    @property
    def instructions(self) -> tuple[Instruction, ...]:
        """What each microbatch runs on each chunk: forward and backward, or its two halves (zero bubble)."""
        spec = SCHEDULES.get(self.schedule)
        return instructions_of(spec is not None and spec.split_backward)

    @property
    def computations(self) -> int:
        """Computations of one iteration, over all stages."""
        return self.num_stages * self.num_microbatches * self.chunks * len(self.instructions)

    def describe(self) -> str:
        chunks = f"x{self.chunks}" if self.chunks > 1 else ""
        gpus = f", {self.stage_gpus} GPUs per stage" if self.stage_gpus > 1 else ""
        return f"{self.schedule} {self.num_stages}x{self.num_microbatches}{chunks}{gpus}"

    def named_orders(self) -> tuple[StageOrder, ...] | None:
        """Each stage's order for a named schedule (None for "observed"); built once per shape."""
        if self.schedule == OBSERVED:
            return None
        return _named_orders(self.schedule, self.num_stages, self.num_microbatches, self.chunks)

    def dag(self, orders: Sequence[StageOrder]) -> ComputationDag:
        """The DAG of this job with these per-stage orders (named or learned)."""
        return from_stage_orders(
            [list(order) for order in orders], self.num_microbatches, self.chunks, self.schedule
        )


@functools.lru_cache(maxsize=32)
def _named_orders(schedule: str, stages: int, microbatches: int, chunks: int) -> tuple[StageOrder, ...]:
    dag = build_dag(schedule, stages, microbatches, chunks)
    return tuple(
        tuple((c.instruction, c.microbatch, c.chunk) for c in (dag.computations[n] for n in ids))
        for ids in dag.stage_orders
    )


def step_of(instruction: str, microbatch: int, chunk: int) -> ScheduleStep:
    return (Instruction(instruction), microbatch, chunk)


def signature(job: str, uid: int, shape: JobShape, gpu_name: str) -> str:
    """The cache key of a job: the same job (name, owner), shape and GPU model skip profiling and solving."""
    text = json.dumps(
        {
            "job": job,
            "uid": uid,
            "schedule": shape.schedule,
            "num_stages": shape.num_stages,
            "num_microbatches": shape.num_microbatches,
            "chunks": shape.chunks,
            "gpu": gpu_name,
            **({"stage_gpus": shape.stage_gpus} if shape.stage_gpus > 1 else {}),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]

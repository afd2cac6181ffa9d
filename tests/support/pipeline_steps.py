"""Training steps told to a daemon core as events, with synthetic timestamps, for unit tests of what the core
does with them (straggler detection, re-planning)."""

from __future__ import annotations

from perseus_client.protocol import ComputationBegin, ComputationEnd, StepBegin, StepEnd

from perseusd.daemon.core import DaemonCore
from perseusd.planner.schedule_orders import one_f_one_b_order
from tests.support.callers import ME

S_NS = 1_000_000_000


def pipeline_step(
    core: DaemonCore,
    pipeline: int,
    step: int,
    start_ns: int,
    compute_s: float,
    *,
    stages: int,
    microbatches: int,
) -> None:
    """Step `step` of 1F1B pipeline `pipeline` of `start_synthetic_job`'s job, told to `core` as events with
    synthetic timestamps: each stage's step begins at `start_ns` and its last computation ends `compute_s`
    later, the computations spread evenly in between."""
    for stage in range(stages):
        gpu = core.registry.uuids[pipeline * stages + stage]
        order = one_f_one_b_order(stages, microbatches, stage)
        core.on_event(ME, StepBegin(gpu, step, start_ns + stage))
        for index, (instruction, microbatch, chunk) in enumerate(order, start=1):
            end_ns = start_ns + round(compute_s * S_NS * index / len(order)) - stage
            args = (gpu, stage, instruction.value, microbatch, chunk)
            core.on_event(ME, ComputationBegin(*args, end_ns - 1000))  # type: ignore[arg-type]
            core.on_event(ME, ComputationEnd(*args, end_ns))  # type: ignore[arg-type]
        core.on_event(ME, StepEnd(gpu, step, start_ns + round(compute_s * S_NS) + 1))

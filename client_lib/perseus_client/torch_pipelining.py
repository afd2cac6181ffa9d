"""Perseus for `torch.distributed.pipelining`: report a schedule's computations to perseusd with one call.

```python
handle = instrument(schedule, client, gpu)  # registers the job, wraps the schedule and its stages
for batch, target in data:
    schedule.step(batch, target=target)  # step and computation events are sent by the wrappers
handle.close()  # the original methods are back
```

Hook points (read from torch 2.13's `schedules.py` and `stage.py`; some are private, check them on upgrades):

- `schedule.step()` is one training iteration: step begin/end. `eval()` runs `step()` with backward turned
  off; that forward-only pass is not the training schedule, so it is not reported.
- `stage.forward_one_chunk(microbatch, ...)`: a forward computation (the last stage's loss is computed by the
  schedule just after it, outside; it is part of the gap before the next computation).
- `stage.backward_one_chunk(microbatch, ..., full_backward=...)`: a backward computation, whole (`backward`)
  or, in the zero-bubble schedules, its input-gradient half (`backward_input`).
- `stage.backward_weight_one_chunk(microbatch, ...)`: the weight-gradient half of a zero-bubble backward
  (`backward_weight`), which nothing waits for but the iteration's end: perseusd plans it on its own, usually
  at a lower clock than the input gradient.

A schedule registered as one whose backwards are split (`interleaved_zb`, `zbv`) reports both halves. Any
other (a zero-bubble subclass registered as "observed", or a daemon older than protocol 6.8, which knows
neither the zero-bubble schedules nor the halves) reports the input gradient as the backward and not the
weight gradient, which then runs at the clock of the computation planned next.

Every schedule calls these for all its computations, single-stage (`ScheduleGPipe`, `Schedule1F1B`) and
multi-stage (`ScheduleInterleaved1F1B`, `ScheduleLoopedBFS`, zero-bubble, DualPipeV) alike. The events carry
stage = this rank's position in the pipeline (its rank in the pipeline group: the physical GPU position),
chunk = the model chunk on this rank (its stages in `stage_index` order: 0 for the first) and the microbatch
the schedule passed. Schedules using `register_custom_function` actions bypass these methods for those
actions.

torch is imported here only: `perseus_client` itself never imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
from torch.distributed.pipelining.stage import _PipelineStageBase

from perseus_client.client import PerseusClient
from perseus_client.message import SPLIT_BACKWARD_SCHEDULES, VALUE_SINCE
from perseus_client.run_id import launcher_run_id
from perseus_client.torch_events import Instrumentation, Reporter, gpu_of, reporter_for

Schedule = PipelineScheduleSingle | PipelineScheduleMulti
_NAMED_SCHEDULES: dict[type[Any], str] = {
    ScheduleGPipe: "gpipe",
    Schedule1F1B: "1f1b",
    ScheduleInterleaved1F1B: "interleaved",
    ScheduleInterleavedZeroBubble: "interleaved_zb",
    ScheduleZBVZeroBubble: "zbv",
}
_COMPUTATIONS = (
    ("forward_one_chunk", "forward", "fwd_chunk_id"),
    ("backward_one_chunk", "backward", "bwd_chunk_id"),
    ("backward_weight_one_chunk", "backward_weight", "bwd_chunk_id"),
)


def local_stages(schedule: Schedule) -> list[_PipelineStageBase]:
    """This rank's stages in `stage_index` order (the list index is the chunk)."""
    if isinstance(schedule, PipelineScheduleSingle):
        return [schedule._stage]
    return sorted(schedule._stages, key=lambda stage: stage.stage_index)


def schedule_name_of(schedule: Schedule) -> str:
    """The perseusd schedule name whose order this schedule runs, or "observed" (the daemon learns it).

    Only the exact torch classes qualify (a subclass may reorder). torch's interleaved 1F1B equals the
    Megatron-LM order perseusd plans only when the microbatches are a multiple of the pipeline ranks; its
    zero-bubble schedules are planned in torch's own orders.
    """
    name = _NAMED_SCHEDULES.get(type(schedule), "observed")
    ranks = local_stages(schedule)[0].group_size
    if name == "interleaved" and schedule._n_microbatches % ranks:
        return "observed"
    return name


def instrument(
    schedule: Schedule,
    client: PerseusClient,
    gpu: str | None = None,
    *,
    num_stages: int | None = None,
    pipeline: int = 0,
    register: bool = True,
    schedule_name: str | None = None,
    first_step: int = 0,
    stage_gpus: int = 1,
    run: str | None = None,
) -> PipelineInstrumentation:
    """Make `schedule` report its steps and computations on `gpu` to perseusd; undo with `.close()`.

    Args:
        schedule: a `torch.distributed.pipelining` schedule, already built with this rank's stage(s).
        client: a client that claimed `gpu` (fail-open: connected or not).
        gpu: the UUID of the GPU this rank runs on (default: its CUDA device's, `PerseusClient.gpu_uuid`).
        num_stages: GPUs in the pipeline (default: the pipeline process group's size).
        pipeline: which data-parallel pipeline this rank belongs to.
        register: join the job now (`client.register`; a strict client raises when the daemon refuses).
        schedule_name: the schedule to register (default: `schedule_name_of(schedule)`).
        first_step: the step number of the next `schedule.step()` (steps count up from it).
        stage_gpus: the GPUs that run this rank's stage together (tensor x context parallel: each registers
            the same `pipeline`; torchtitan: `parallel_dims.tp * parallel_dims.cp`).
        run: the id all ranks of this run share (default: the launcher's, `launcher_run_id()`).
    """
    stages = local_stages(schedule)
    position = stages[0].group_rank
    gpu = gpu_of(client, gpu, stages[0].device)
    name = schedule_name or schedule_name_of(schedule)
    if VALUE_SINCE.get(name, 0) > client.protocol_minor:  # a daemon that predates it: it learns the order
        name = "observed"
    if register:
        client.register(
            gpu,
            stage=position,
            num_stages=num_stages or stages[0].group_size,
            num_microbatches=schedule._n_microbatches,
            schedule=name,
            pipeline=pipeline,
            chunks=len(stages),
            stage_gpus=stage_gpus,
            run=launcher_run_id() if run is None else run,
        )
    reporter = reporter_for(client, gpu, stages[0].device)
    return PipelineInstrumentation(schedule, stages, reporter, first_step, name in SPLIT_BACKWARD_SCHEDULES)


class PipelineInstrumentation(Instrumentation):
    """The wrappers `instrument` installed; `close()` (or leaving a `with` block) removes them. A step is one
    training `schedule.step()`."""

    def __init__(
        self,
        schedule: Schedule,
        stages: list[_PipelineStageBase],
        reporter: Reporter,
        first_step: int,
        split_backward: bool = False,
    ) -> None:
        super().__init__(reporter, stages[0].group_rank, first_step)
        self._split_backward = split_backward
        self._saved: list[tuple[object, str, object | None]] = []
        self._patch(schedule, "step", self._wrap_step(schedule))
        for chunk, stage in enumerate(stages):
            for method, instruction, keyword in _COMPUTATIONS:
                if instruction == "backward_weight" and not split_backward:
                    continue  # not reported: it runs at the clock of the computation planned next
                self._patch(
                    stage, method, self._wrap_computation(getattr(stage, method), instruction, chunk, keyword)
                )

    def close(self) -> None:
        """Restore the original methods (in reverse order) and send any events still pending."""
        while self._saved:
            target, name, previous = self._saved.pop()
            if previous is None:
                delattr(target, name)
            else:
                setattr(target, name, previous)
        super().close()

    def _patch(self, target: object, name: str, wrapper: Callable[..., Any]) -> None:
        """Shadow a method with an instance attribute, remembering any instance attribute it replaced."""
        self._saved.append((target, name, vars(target).get(name)))
        setattr(target, name, wrapper)

    def _wrap_step(self, schedule: Schedule) -> Callable[..., Any]:
        original: Callable[..., Any] = schedule.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if not schedule._has_backward:  # eval(): forward only, not the training order
                return original(*args, **kwargs)
            return self._run_step(original, args, kwargs)

        return step

    def _wrap_computation(
        self, original: Callable[..., Any], instruction: str, chunk: int, keyword: str
    ) -> Callable[..., Any]:
        reporter = self._reporter

        def computation(*args: Any, **kwargs: Any) -> Any:
            if not self._in_step:
                return original(*args, **kwargs)
            microbatch = int(args[0] if args else kwargs[keyword])
            name = instruction
            if name == "backward" and self._split_backward and not _full_backward(args, kwargs):
                name = "backward_input"
            reporter.computation_begin(self.position, name, microbatch, chunk)
            try:
                return original(*args, **kwargs)
            finally:
                reporter.computation_end(self.position, name, microbatch, chunk)

        return computation


def _full_backward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """`backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, ...)`'s `full_backward`."""
    return bool(args[2] if len(args) > 2 else kwargs.get("full_backward", True))

"""Perseus for DeepSpeed's pipeline engine: `instrument_deepspeed(engine, client, gpu)`, one line.

Hook points (read from deepspeed 0.19's `runtime/pipe/engine.py` and `schedule.py`; check them on upgrades):

- `engine.train_batch()` is one training iteration (its optimizer step included): step begin/end.
  `eval_batch()` runs an `InferenceSchedule`; it is not reported.
- `train_batch()` executes a `TrainSchedule` instruction stream through the engine's `_INSTRUCTION_MAP`
  (instruction class -> engine function). The instrumentation gives the engine its own copy of that map in
  which `ForwardPass` and `BackwardPass` run the original functions between begin/end events; the class and
  the other instructions (loads, sends, receives, reductions, optimizer step) are untouched.
- `ForwardPass(buffer_id)` names a pipeline buffer slot, reused across microbatches, not a microbatch.
  `TrainSchedule` runs the forwards in microbatch order and the backwards in microbatch order, so the k-th
  forward (backward) of an iteration is microbatch k. chunk is always 0 (no interleaving).

The engine's `TrainSchedule` is 1F1B per stage (warm-up forwards, then backward/forward pairs), so the
rank registers `1f1b` (tested against the schedule objects and against real runs); an engine subclass with
its own `_train_schedule` registers `observed`.

deepspeed is imported only when `instrument_deepspeed` is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perseus_client.client import PerseusClient
from perseus_client.run_id import launcher_run_id
from perseus_client.torch_events import Instrumentation, Reporter, gpu_of, reporter_for


def instrument_deepspeed(
    engine: Any,
    client: PerseusClient,
    gpu: str | None = None,
    *,
    pipeline: int | None = None,
    register: bool = True,
    schedule_name: str | None = None,
    first_step: int = 0,
    cuda_events: bool | None = None,
    stage_gpus: int | None = None,
    run: str | None = None,
) -> DeepSpeedInstrumentation:
    """Make a `deepspeed.runtime.pipe.engine.PipelineEngine` report each `train_batch()` to perseusd.

    Args:
        engine: the engine `deepspeed.initialize` returned for a `PipelineModule`.
        client: a client that claimed `gpu` (fail-open: connected or not).
        gpu: the UUID of this rank's GPU (default: the engine's CUDA device's, `PerseusClient.gpu_uuid`).
        pipeline: which pipeline this rank belongs to (default: its data-parallel index in the engine's grid).
        register: join the job now (`client.register`; a strict client raises when the daemon refuses).
        schedule_name: the schedule to register (default: `1f1b` for the engine's own `TrainSchedule`).
        first_step: the step number of the next `train_batch()`.
        cuda_events: report through CUDA events (default: when the engine's device is a CUDA device).
        stage_gpus: the GPUs that run this stage together (default: the grid's model-parallel slice, its
            tensor parallelism); the daemon profiles, plans and switches them as one stage.
        run: the id all ranks of this run share (default: the launcher's, `launcher_run_id()`).
    """
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if not isinstance(engine, PipelineEngine):
        raise TypeError(f"expected a DeepSpeed PipelineEngine, got {type(engine).__name__}")
    own_schedule = type(engine)._train_schedule is PipelineEngine._train_schedule
    device = _torch_device(engine.device)
    gpu = gpu_of(client, gpu, device)
    if register:
        client.register(
            gpu,
            stage=engine.stage_id,
            num_stages=engine.num_stages,
            num_microbatches=engine.micro_batches,
            schedule=schedule_name or ("1f1b" if own_schedule else "observed"),
            pipeline=engine.grid.data_parallel_id if pipeline is None else pipeline,
            chunks=1,
            stage_gpus=engine.grid.get_slice_parallel_world_size() if stage_gpus is None else stage_gpus,
            run=launcher_run_id() if run is None else run,
        )
    cuda = device.type == "cuda" if cuda_events is None else cuda_events
    return DeepSpeedInstrumentation(engine, reporter_for(client, gpu, device if cuda else None), first_step)


def _torch_device(device: Any) -> Any:
    """The engine's device as a `torch.device` (DeepSpeed keeps a device, a string or an index)."""
    import torch

    return device if isinstance(device, torch.device) else torch.device(device)


class DeepSpeedInstrumentation(Instrumentation):
    """The wrappers `instrument_deepspeed` installed on the engine; `close()` removes them. A step is one
    `train_batch()`."""

    def __init__(self, engine: Any, reporter: Reporter, first_step: int) -> None:
        from deepspeed.runtime.pipe import schedule

        super().__init__(reporter, engine.stage_id, first_step)
        self._engine = engine
        self._counts = {"forward": 0, "backward": 0}
        instructions = dict(type(engine)._INSTRUCTION_MAP)
        for cls, name in ((schedule.ForwardPass, "forward"), (schedule.BackwardPass, "backward")):
            instructions[cls] = self._wrap_computation(instructions[cls], name)
        self._saved = {name: vars(engine).get(name) for name in ("train_batch", "_INSTRUCTION_MAP")}
        engine._INSTRUCTION_MAP = instructions
        engine.train_batch = self._wrap_train_batch(engine.train_batch)

    def close(self) -> None:
        """Restore the engine's own methods and send any events still pending."""
        for name, previous in self._saved.items():
            if previous is None:
                vars(self._engine).pop(name, None)
            else:
                setattr(self._engine, name, previous)
        self._saved = {}
        super().close()

    def _wrap_train_batch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def train_batch(*args: Any, **kwargs: Any) -> Any:
            self._counts = {"forward": 0, "backward": 0}
            return self._run_step(original, args, kwargs)

        return train_batch

    def _wrap_computation(self, original: Callable[..., Any], instruction: str) -> Callable[..., Any]:
        def computation(engine: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._in_step:
                return original(engine, *args, **kwargs)
            microbatch = self._counts[instruction]
            self._counts[instruction] += 1
            self._reporter.computation_begin(self.position, instruction, microbatch, 0)
            try:
                return original(engine, *args, **kwargs)
            finally:
                self._reporter.computation_end(self.position, instruction, microbatch, 0)

        return computation

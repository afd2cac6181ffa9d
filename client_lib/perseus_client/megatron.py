"""Perseus for Megatron-Core: wrap the function `get_forward_backward_func()` returns, one line.

```python
forward_backward_func = instrument_megatron(get_forward_backward_func(), client, gpu, num_microbatches=8)
losses = forward_backward_func(forward_step_func=..., data_iterator=..., model=..., num_microbatches=8, ...)
```

Hook points (read from megatron-core 0.16's `pipeline_parallel/schedules.py`; check them on upgrades):

- One call of the forward-backward function with `forward_only=False` is one training iteration: step
  begin/end. `forward_only=True` (evaluation) is passed through unreported.
- Every schedule (`forward_backward_no_pipelining`, `forward_backward_pipelining_without_interleaving`,
  `forward_backward_pipelining_with_interleaving`) runs each computation through the module-level functions
  `forward_step(...)` and `backward_step(...)`, looked up at call time. During an instrumented call the
  module attributes are wrappers; they are restored when the call returns.
- `forward_step` gets `current_microbatch=` (the microbatch within its model chunk) and, when interleaving,
  `vp_stage=` (the model chunk). `backward_step` gets no ids, but it gets the very `output_tensor` object the
  matching `forward_step` returned, so the backward is matched to its forward by that object's identity: no
  microbatch arithmetic to keep in sync with Megatron's interleaving tables.

Not reported: the combined 1F1B path of `overlap_moe_expert_parallel_comm` (it runs its own forward/backward
helpers, and needs CUDA and Transformer Engine), the loss function (inside `forward_step` on the last stage,
so it is part of that forward), and the gradient reductions and optimizer step (between steps).

megatron-core is imported only when `instrument_megatron` is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perseus_client.client import PerseusClient
from perseus_client.run_id import launcher_run_id
from perseus_client.torch_events import Instrumentation, Reporter, gpu_of, reporter_for

_INTERLEAVED = "forward_backward_pipelining_with_interleaving"


def schedule_name_for(function_name: str, num_stages: int, num_microbatches: int) -> str:
    """The perseusd schedule whose order a Megatron forward-backward function runs, or "observed".

    Without interleaving (and without pipelining: one stage) Megatron runs exactly 1F1B. With interleaving it
    runs the Megatron-LM interleaved order perseusd plans when the microbatches are a multiple of the stages
    and more than them (with as many microbatches as stages it runs all forwards first); otherwise the
    daemon learns the order.
    """
    if function_name != _INTERLEAVED:
        return "1f1b"
    if num_microbatches % num_stages or num_microbatches == num_stages:
        return "observed"
    return "interleaved"


def instrument_megatron(
    forward_backward_func: Callable[..., Any],
    client: PerseusClient,
    gpu: str | None = None,
    *,
    num_microbatches: int,
    pipeline: int | None = None,
    register: bool = True,
    schedule_name: str | None = None,
    first_step: int = 0,
    cuda_events: bool | None = None,
    stage_gpus: int | None = None,
    run: str | None = None,
) -> MegatronInstrumentation:
    """Wrap a Megatron-Core forward-backward function so that each training call reports to perseusd.

    Args:
        forward_backward_func: what `megatron.core.pipeline_parallel.get_forward_backward_func()` returned,
            with `megatron.core.parallel_state` initialised.
        client: a client that claimed `gpu` (fail-open: connected or not).
        gpu: the UUID of this rank's GPU (default: torch's current CUDA device's, `PerseusClient.gpu_uuid`).
        num_microbatches: the microbatches per iteration (`get_num_microbatches()`), for the registration.
        pipeline: which pipeline this rank belongs to (default: its data-parallel rank; the tensor- and
            context-parallel ranks of a stage share it: they run the stage together).
        register: join the job now (`client.register`; a strict client raises when the daemon refuses).
        schedule_name: the schedule to register (default: `schedule_name_for(...)`).
        first_step: the step number of the next training call.
        cuda_events: report through CUDA events (default: when CUDA is available).
        stage_gpus: the GPUs that run this stage together (default: the tensor-parallel size times the
            context-parallel size); the daemon profiles, plans and switches them as one stage.
        run: the id all ranks of this run share (default: the launcher's, `launcher_run_id()`).
    """
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules

    num_stages = parallel_state.get_pipeline_model_parallel_world_size()
    position = parallel_state.get_pipeline_model_parallel_rank()
    chunks = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    if pipeline is None:
        pipeline = parallel_state.get_data_parallel_rank(with_context_parallel=False)
    if stage_gpus is None:
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
        stage_gpus = tp_size * parallel_state.get_context_parallel_world_size()
    name = schedule_name or schedule_name_for(forward_backward_func.__name__, num_stages, num_microbatches)
    gpu = gpu_of(client, gpu)
    if register:
        client.register(
            gpu,
            stage=position,
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            schedule=name,
            pipeline=pipeline,
            chunks=chunks,
            stage_gpus=stage_gpus,
            run=launcher_run_id() if run is None else run,
        )
    if cuda_events is None:
        cuda_events = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda_events else None
    reporter = reporter_for(client, gpu, device)
    return MegatronInstrumentation(forward_backward_func, schedules, reporter, position, first_step)


class MegatronInstrumentation(Instrumentation):
    """A forward-backward function that reports; call it as the original (one training call is a step).
    `close()` sends what is pending; the forward-backward function is not wrapped then."""

    def __init__(
        self,
        forward_backward_func: Callable[..., Any],
        schedules: Any,
        reporter: Reporter,
        position: int,
        first_step: int,
    ) -> None:
        super().__init__(reporter, position, first_step)
        self.__name__ = forward_backward_func.__name__
        self._original = forward_backward_func
        self._schedules = schedules
        self._forwards: dict[int, tuple[object, int, int]] = {}  # id(output) -> (output, microbatch, chunk)
        self._counts: dict[int, int] = {}  # forwards seen per chunk (when Megatron passes no microbatch)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("forward_only", False):
            return self._original(*args, **kwargs)
        self._forwards.clear()
        self._counts.clear()
        module = self._schedules
        forward_step, backward_step = module.forward_step, module.backward_step
        module.forward_step = self._wrap_forward(forward_step)
        module.backward_step = self._wrap_backward(backward_step)
        try:
            return self._run_step(self._original, args, kwargs)
        finally:
            module.forward_step, module.backward_step = forward_step, backward_step
            self._forwards.clear()

    def _wrap_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward_step(*args: Any, **kwargs: Any) -> Any:
            chunk = int(kwargs.get("vp_stage") or 0)
            microbatch = kwargs.get("current_microbatch")
            if microbatch is None:
                microbatch = self._counts.get(chunk, 0)
            self._counts[chunk] = int(microbatch) + 1
            self._reporter.computation_begin(self.position, "forward", int(microbatch), chunk)
            result = None
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                self._reporter.computation_end(self.position, "forward", int(microbatch), chunk)
                if result is not None:
                    output = result[0]
                    self._forwards[id(output)] = (output, int(microbatch), chunk)

        return forward_step

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward_step(
            input_tensor: Any, output_tensor: Any, output_tensor_grad: Any, *args: Any, **kwargs: Any
        ) -> Any:
            known = self._forwards.pop(id(output_tensor), None)
            if known is None:  # not a forward this step reported: run it unreported
                return original(input_tensor, output_tensor, output_tensor_grad, *args, **kwargs)
            _, microbatch, chunk = known
            self._reporter.computation_begin(self.position, "backward", microbatch, chunk)
            try:
                return original(input_tensor, output_tensor, output_tensor_grad, *args, **kwargs)
            finally:
                self._reporter.computation_end(self.position, "backward", microbatch, chunk)

        return backward_step

"""One Megatron-Core rank for tests/client/test_megatron.py (a separate process, gloo on loopback, CPU).

Runs Megatron-Core's own forward-backward function (from `get_forward_backward_func()`) on a tiny model, first
plainly and then wrapped by `instrument_megatron` talking to a real perseusd. What really executes is
recorded independently of the integration: a forward is the model chunk taking the next item from its data
iterator (the item is the microbatch), a backward is autograd running a probe inside the chunk (the probe
remembers the microbatch and chunk of its forward).

Megatron-Core's schedules allocate a few bookkeeping tensors with `device="cuda"` (a token counter, p2p shape
buffers) and call `torch.cuda.synchronize()` around p2p transfers. On a CPU-only machine this worker maps
those to the CPU (a TorchFunctionMode rewriting the device; `current_device()` 0, no-op synchronise): the
schedule code itself, its p2p communication over gloo and autograd run unchanged.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.overrides import TorchFunctionMode
from torch_pipelining_worker import claimed_client, instrument_reporting

WIDTH = 8
STEPS = 2
Log = list[list[Any]]


class CpuForCuda(TorchFunctionMode):
    """Tensors Megatron asks for on "cuda" (or device 0) are made on the CPU."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if isinstance(device, int) or (device is not None and "cuda" in str(device)):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


class Probe(torch.autograd.Function):
    """Identity whose backward logs the microbatch and chunk of its forward: autograd's real order."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ids: tuple[int, int], log: Log) -> torch.Tensor:
        ctx.ids, ctx.log = ids, log
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.log.append(["backward", *ctx.ids])
        return grad, None, None


class Chunk(nn.Module):
    """A model chunk as Megatron expects it: `config`, `set_input_tensor`, a [seq, batch, hidden] forward."""

    def __init__(self, config: Any, chunk: int, log: Log) -> None:
        super().__init__()
        self.config = config
        self.chunk = chunk
        self.log = log
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.input_tensor: torch.Tensor | None = None
        self.microbatch = -1
        from megatron.core.enums import ModelType

        self.model_type = ModelType.encoder_or_decoder

    def set_input_tensor(self, tensor: Any) -> None:
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_tensor is not None:
            x = self.input_tensor
        out = Probe.apply(self.linear(x), (self.microbatch, self.chunk), self.log)
        return torch.tanh(out)


def data(seed: int) -> Iterator[tuple[int, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    microbatch = 0
    while True:
        yield microbatch, torch.randn(1, 1, WIDTH, generator=generator)
        microbatch += 1


def forward_step_func(iterator: Iterator[tuple[int, torch.Tensor]], model: Chunk) -> Any:
    microbatch, x = next(iterator)
    model.microbatch = microbatch
    model.log.append(["forward", microbatch, model.chunk])

    def loss_func(output: torch.Tensor) -> Any:
        loss = output.float().pow(2).mean()
        return loss, {"loss": loss.detach()}

    return model(x), loss_func


def train(config: dict[str, Any], forward_backward_func: Any, log: Log) -> dict[str, Any]:
    """STEPS training iterations of Megatron's schedule, then one evaluation (forward_only)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    pp, vp = config["pp"], config["vp"]
    tp = config.get("tp", 1)
    megatron_config = TransformerConfig(
        num_layers=pp * (vp or 1),
        hidden_size=WIDTH,
        num_attention_heads=tp,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        pipeline_dtype=torch.float32,
        batch_p2p_comm=False,
    )
    torch.manual_seed(parallel_state.get_pipeline_model_parallel_rank())
    chunks = [Chunk(megatron_config, chunk, log) for chunk in range(vp or 1)]
    optimizer = torch.optim.SGD([p for chunk in chunks for p in chunk.parameters()], lr=0.1)

    def arguments(step: int) -> dict[str, Any]:
        """A fresh batch each iteration: one iterator per chunk, its k-th item is microbatch k."""
        iterators = [data(seed=100 * step + chunk) for chunk in range(len(chunks))]
        return {**fixed, "data_iterator": iterators if vp else iterators[0]}

    fixed: dict[str, Any] = {
        "forward_step_func": forward_step_func,
        "model": chunks if vp else chunks[0],
        "num_microbatches": config["microbatches"],
        "seq_length": 1,
        "micro_batch_size": 1,
    }
    losses = []
    with CpuForCuda():
        for step in range(STEPS):
            optimizer.zero_grad()
            result = forward_backward_func(**arguments(step), forward_only=False)
            optimizer.step()
            losses.append([float(item["loss"]) for item in result])
        executed = len(log)
        with torch.no_grad():
            forward_backward_func(**arguments(STEPS), forward_only=True)
    del log[executed:]  # the evaluation is not the training order
    params = [p.detach().flatten().tolist() for chunk in chunks for p in chunk.parameters()]
    return {"losses": losses, "params": params, "executed": list(log)}


def instrumented(config: dict[str, Any], rank: int) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from perseus_client.megatron import instrument_megatron

    client, gpu = claimed_client(config)
    log: Log = []
    function = get_forward_backward_func()
    report: dict[str, Any] = {"function": function.__name__, "gpu": gpu, "rank": rank}
    options: dict[str, Any] = {"num_microbatches": config["microbatches"], "cuda_events": False}  # CPU run
    wrapped = instrument_reporting(report, gpu, partial(instrument_megatron, function, client, **options))
    report["registered"] = [event for event in client.sent if event[0] == "register"]
    client.sent.clear()
    originals = (schedules.forward_step, schedules.backward_step)
    with wrapped:
        report.update(train(config, wrapped, log))
    report["restored"] = (schedules.forward_step, schedules.backward_step) == originals
    report["events"] = client.sent
    report["events_dropped"] = client.events_dropped
    report["stage"] = parallel_state.get_pipeline_model_parallel_rank()
    dist.barrier()
    client.close()
    return report


def run_case(config: dict[str, Any], rank: int) -> dict[str, Any]:
    """One case on this rank: Megatron's schedule plainly, then instrumented (same seeds)."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=config.get("tp", 1),
        pipeline_model_parallel_size=config["pp"],
        virtual_pipeline_model_parallel_size=config["vp"],
    )
    try:
        baseline = train(config, get_forward_backward_func(), [])
        return {"baseline": baseline, "instrumented": instrumented(config, rank)}
    finally:
        parallel_state.destroy_model_parallel()
        dist.barrier()


def _no_synchronize(device: Any = None) -> None:
    """Nothing to wait for on the CPU."""


def main() -> None:
    """argv[1]: {"rank", "world", "store", "cases": {name: case}}; writes {name: report} to argv[2]."""
    warnings.filterwarnings("ignore")
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]  # see the module docstring
    torch.cuda.synchronize = _no_synchronize
    config = json.loads(sys.argv[1])
    rank, world = config["rank"], config["world"]
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=world)
    try:
        reports = {name: run_case(case, rank) for name, case in config["cases"].items()}
    finally:
        dist.destroy_process_group()
    Path(sys.argv[2]).write_text(json.dumps(reports))


if __name__ == "__main__":
    main()

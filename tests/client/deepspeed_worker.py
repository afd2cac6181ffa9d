"""One DeepSpeed pipeline rank for tests/client/test_deepspeed.py (a separate process, gloo, CPU accelerator).

Trains a tiny `PipelineModule` with DeepSpeed's `PipelineEngine.train_batch()`, first plainly and then
instrumented, talking to a real perseusd. What really executes is recorded independently of the
integration: every sample carries its microbatch number in an extra column that the layers pass along
untouched, a layer logs a forward when it runs on a microbatch, and an autograd probe logs the backward.

DeepSpeed's CPU accelerator would JIT-compile an optional shared-memory collective op (C++) when
initialising; the worker marks that op unavailable, so collectives go through plain gloo.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron_worker import Log, Probe
from torch import nn
from torch_pipelining_worker import claimed_client, instrument_reporting

WIDTH = 8
STEPS = 2


class Layer(nn.Module):
    """Linear+Tanh on the first WIDTH columns; the last column (the microbatch number) passes through."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        microbatch = int(x[0, WIDTH])
        self.log.append(["forward", microbatch, 0])
        y = Probe.apply(self.linear(x[:, :WIDTH]), (microbatch, 0), self.log)
        return torch.cat([torch.tanh(y), x[:, WIDTH:].detach()], dim=1)


def loss_fn(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output[:, :WIDTH], labels)


def batches(step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(step)
    microbatch = 0
    while True:
        x = torch.randn(1, WIDTH, generator=generator)
        yield torch.cat([x, torch.full((1, 1), float(microbatch))], dim=1), torch.randn(1, WIDTH)
        microbatch += 1


def build_engine(case: dict[str, Any], log: Log) -> Any:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    module = PipelineModule(
        layers=[Layer(log) for _ in range(case["pp"])],
        num_stages=case["pp"],
        loss_fn=loss_fn,
        partition_method="uniform",
    )
    dp = dist.get_world_size() // case["pp"]
    config = {
        "train_batch_size": case["microbatches"] * dp,
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=module, model_parameters=list(module.parameters()), config=config)
    return engine


def train(engine: Any, log: Log) -> dict[str, Any]:
    losses = [float(engine.train_batch(batches(step))) for step in range(STEPS)]
    executed = len(log)
    engine.eval_batch(batches(STEPS))  # must not be reported
    del log[executed:]
    params = [p.detach().flatten().tolist() for p in engine.module.parameters()]
    return {"losses": losses, "params": params, "executed": list(log)}


def instrumented(case: dict[str, Any], rank: int) -> dict[str, Any]:
    from deepspeed.runtime.pipe import schedule
    from perseus_client.deepspeed_pipe import instrument_deepspeed

    client, gpu = claimed_client(case)
    log: Log = []
    engine = build_engine(case, log)
    report: dict[str, Any] = {"stage": engine.stage_id, "gpu": gpu, "rank": rank}
    instrument = partial(instrument_deepspeed, engine, client, cuda_events=False)
    handle = instrument_reporting(report, gpu, instrument)
    report["registered"] = [event for event in client.sent if event[0] == "register"]
    client.sent.clear()
    with handle:
        report.update(train(engine, log))
    report["restored"] = not {"train_batch", "_INSTRUCTION_MAP"} & set(vars(engine))
    report["events"] = client.sent
    report["events_dropped"] = client.events_dropped
    kinds = {schedule.ForwardPass: "forward", schedule.BackwardPass: "backward"}
    train_schedule = schedule.TrainSchedule(
        micro_batches=engine.micro_batches, stages=engine.num_stages, stage_id=engine.stage_id
    )
    report["schedule_object"] = [kinds[type(c)] for cmds in train_schedule for c in cmds if type(c) in kinds]
    dist.barrier()
    client.close()
    return report


def main() -> None:
    """argv[1]: {"rank", "world", "store", "cases": {name: case}}; writes {name: report} to argv[2]."""
    warnings.filterwarnings("ignore")
    config = json.loads(sys.argv[1])
    rank, world = config["rank"], config["world"]
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world)
    )
    os.environ["DS_ACCELERATOR"] = "cpu"  # gloo ranks on the CPU, even where a GPU is present
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=world)
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # see the module docstring
    deepspeed.init_distributed(dist_backend="gloo")
    reports = {}
    try:
        for name, case in config["cases"].items():
            log: Log = []
            baseline = train(build_engine(case, log), log)
            reports[name] = {"baseline": baseline, "instrumented": instrumented(case, rank)}
            dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(sys.argv[2]).write_text(json.dumps(reports))


if __name__ == "__main__":
    main()

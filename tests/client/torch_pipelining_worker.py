"""One pipeline rank for tests/client/test_torch_pipelining.py (run as a separate process, gloo on loopback).

Trains a tiny model twice with the same seeds: without the integration, then with `instrument` talking to a
real perseusd through a client that also records every event it sends. Rank 0 then asks the daemon for the
plan it built from the schedule it learned. Writes a JSON report (argv[2]) of losses, parameters, events and
the schedule's own per-rank order.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.torch_pipelining import (
    PipelineInstrumentation,
    instrument,
    local_stages,
    schedule_name_of,
)
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

SCHEDULES: dict[str, Any] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "interleaved_zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
}
WIDTH = 8
BATCH = 8
STEPS = 3
PLAN_WAIT_S = 20.0
P_BLOCK_W = 80.0  # the blocking power of the imported profile
Handle = TypeVar("Handle")


class RecordingClient(PerseusClient):
    """Sends like the real client and keeps what it sent, in order, and from which threads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[list[Any]] = []
        self.threads: set[str] = set()
        kwargs.setdefault("strict", True)  # the tests check what the daemon says; fail-open has its own
        super().__init__(*args, **kwargs)

    def register(self, gpu: str, **fields: Any) -> Any:
        self.sent.append(["register", fields])
        return super().register(gpu, **fields)

    def computation_begin(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> None:
        self._keep("comp_begin", stage, instruction, microbatch, chunk)
        super().computation_begin(gpu, stage, instruction, microbatch, chunk)

    def computation_end(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> None:
        self._keep("comp_end", stage, instruction, microbatch, chunk)
        super().computation_end(gpu, stage, instruction, microbatch, chunk)

    def step_begin(self, gpu: str, step: int) -> None:
        self._keep("step_begin", step)
        super().step_begin(gpu, step)

    def step_end(self, gpu: str, step: int) -> None:
        self._keep("step_end", step)
        super().step_end(gpu, step)

    def _keep(self, *event: Any) -> None:
        self.threads.add(threading.current_thread().name)
        self.sent.append(list(event))


def claimed_client(config: dict[str, Any]) -> tuple[RecordingClient, str]:
    """A recording client of the case's job holding this rank's GPU, found as under a launcher (its
    CUDA_VISIBLE_DEVICES and LOCAL_RANK)."""
    client = RecordingClient(config["runtime_dir"], job=config["job"], timeout_s=5.0)
    gpu = client.gpu_uuid()
    assert gpu is not None
    client.claim([gpu])
    return client, gpu


def instrument_reporting(
    report: dict[str, Any], gpu: str, instrument: Callable[..., Handle], **registering: Any
) -> Handle:
    """`instrument(**registering)`: the integration registers and finds the GPU itself. Where the daemon
    cannot take the job, `instrument(gpu, register=False)`, so the events are still checked.
    `report["register"]` says which ("ok" or the refusal's code and message)."""
    try:
        handle = instrument(**registering)
        report["register"] = ["ok", None]
    except PerseusClientError as exc:
        report["register"] = [exc.code, exc.message]
        handle = instrument(gpu, register=False)
    return handle


def build_schedule(config: dict[str, Any], rank: int, world: int) -> Any:
    """This rank's stages of the same seeded model on every rank (Linear+Tanh per model stage), scheduled."""
    chunks, microbatches = config["chunks"], config["microbatches"]
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(world * chunks)]
    v_shape = config["schedule"] == "zbv"  # chunk 0 down the ranks, chunk 1 back up
    indices = [rank, 2 * world - 1 - rank] if v_shape else range(rank, world * chunks, world)
    stages = [PipelineStage(layers[index], index, world * chunks, torch.device("cpu")) for index in indices]
    if "torchtitan" in config:  # torchtitan builds the schedule from its config names
        return build_torchtitan_schedule(config["torchtitan"], stages, world, microbatches)
    cls = SCHEDULES[config["schedule"]]
    stage_arg = stages if chunks > 1 else stages[0]
    return cls(stage_arg, n_microbatches=microbatches, loss_fn=nn.functional.mse_loss)


def build_torchtitan_schedule(name: str, stages: list[PipelineStage], world: int, microbatches: int) -> Any:
    """The schedule torchtitan's trainer builds for `parallelism.pipeline_parallel_schedule = name`."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, None]:
        return nn.functional.mse_loss(output, target), None  # torchtitan losses also return a token count

    parallelism = ParallelismConfig(pipeline_parallel_degree=world, pipeline_parallel_schedule=name)
    return _build_pipeline_schedule(
        parallelism=parallelism, local_batch_size=microbatches, stages=stages, loss_fn=loss_fn
    )


def train(schedule: Any, evaluate: bool = True) -> dict[str, Any]:
    stages = local_stages(schedule)
    params = [p for stage in stages for p in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(BATCH, WIDTH, generator=generator)
    target = torch.randn(BATCH, WIDTH, generator=generator)
    has_first, has_last = stages[0].is_first, stages[-1].is_last
    losses: list[list[float]] = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        step_losses: list[torch.Tensor] = []
        args = (inputs,) if has_first else ()
        kwargs: dict[str, Any] = {"target": target, "losses": step_losses} if has_last else {}
        schedule.step(*args, **kwargs)
        optimizer.step()
        losses.append([loss.item() for loss in step_losses])
    if evaluate:  # torch 2.13's ScheduleZBVZeroBubble cannot run eval() (its forward-only pass fails)
        with torch.no_grad():
            schedule.eval(*args, **({"target": target} if has_last else {}))  # must not be reported
    return {"losses": losses, "params": [p.detach().flatten().tolist() for p in params]}


def outcome(action: Any) -> list[Any]:
    try:
        return ["ok", action()]
    except PerseusClientError as exc:
        return [exc.code, exc.message]


def wait_for_plan(client: PerseusClient, job: str) -> list[Any]:
    """The daemon's plan document once it has one (it needs a learned order and the imported profile)."""
    deadline_s = time.monotonic() + PLAN_WAIT_S
    while True:
        result = outcome(lambda: client.plan(job)["stages"])
        if result[0] in ("ok", "UNKNOWN_TYPE") or time.monotonic() > deadline_s:
            return result
        time.sleep(0.1)


def instrumented_run(config: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    client, gpu = claimed_client(config)
    if rank == 0:
        csv_text = Path(config["profile"]).read_text()
        report: dict[str, Any] = {
            "profile_import": outcome(lambda: str(client.profile_import(csv_text, p_block_w=P_BLOCK_W)))
        }
    else:
        report = {}
    dist.barrier()  # every rank registers after the profile is there
    schedule = build_schedule(config, rank, world)
    report["named"] = schedule_name_of(schedule)
    report["gpu"] = gpu
    registered_as = config.get("register_as", "observed")  # named: the daemon plans its own order
    handle: PipelineInstrumentation = instrument_reporting(
        report, gpu, partial(instrument, schedule, client), schedule_name=registered_as
    )
    report.update(train(schedule, config.get("eval", True)))
    handle.close()
    report["events"] = [event for event in client.sent if event[0] != "register"]
    report["events_dropped"] = client.events_dropped
    if rank == 0:
        report["plan"] = wait_for_plan(client, config["job"])
    dist.barrier()  # everyone stays registered until rank 0 has the plan
    client.close()
    return report


def main() -> None:
    config = json.loads(sys.argv[1])
    rank, world = config["rank"], config["world"]
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=world)
    try:
        baseline = train(build_schedule(config, rank, world), config.get("eval", True))
        report = {"baseline": baseline, "instrumented": instrumented_run(config, rank, world)}
    finally:
        dist.destroy_process_group()
    Path(sys.argv[2]).write_text(json.dumps(report))


if __name__ == "__main__":
    main()

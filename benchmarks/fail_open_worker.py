"""One rank of benchmarks/bench_fail_open.py: a `torch.distributed.pipelining` 1F1B job on CPU (gloo),
instrumented exactly as docs/pytorch.md shows, whatever the daemon does meanwhile.

The runtime directory comes from `PERSEUSD_RUNTIME_DIR`, the GPU from `CUDA_VISIBLE_DEVICES` (its UUID, as
a launcher sets it); the client is the default, fail-open one. Trains until the driver's stop file appears
(at most `max_steps`), appending each step to the progress file (rank 0), then releases and closes. Exit 0
and a JSON report (argv[2]) when training finished; anything raised is a failed run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from perseus_client import PerseusClient
from perseus_client.torch_pipelining import instrument
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


def main() -> None:
    config: dict[str, Any] = json.loads(sys.argv[1])
    rank, world = config["rank"], config["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=world)
    torch.manual_seed(rank)
    width = config["width"]
    stage = PipelineStage(nn.Sequential(nn.Linear(width, width), nn.Tanh()), rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=config["microbatches"], loss_fn=nn.functional.mse_loss)
    rows = config["microbatches"] * 8
    inputs, target = torch.randn(rows, width), torch.randn(rows, width)

    client = PerseusClient(job=config["job"], timeout_s=2.0)  # as docs/pytorch.md: fail-open, env's directory
    gpu = client.gpu_uuid()
    assert gpu is not None
    if rank == 0 and config.get("profile"):
        client.profile_import(Path(config["profile"]).read_text(), p_block_w=80.0)
    client.claim([gpu])
    dist.barrier()
    stop, progress = Path(config["stop"]), Path(config["progress"])
    steps = 0
    with instrument(schedule, client, gpu):
        while steps < config["max_steps"]:
            if rank == 0:
                schedule.step(inputs)
            else:
                schedule.step(target=target)
            steps += 1
            done = torch.tensor([int(stop.exists())])
            dist.all_reduce(done)  # every rank stops after the same step
            if rank == 0:
                with progress.open("a") as out:
                    out.write(f"{steps} {time.time()}\n")
            if int(done.item()):
                break
    client.release()
    client.close()
    report = {
        "steps": steps,
        "events_sent": client.events_sent,
        "events_dropped": client.events_dropped,
        "calls_skipped": client.calls_skipped,
        "reconnects": client.reconnects,
    }
    dist.destroy_process_group()
    Path(sys.argv[2]).write_text(json.dumps(report))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

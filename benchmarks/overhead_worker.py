"""One rank of benchmarks/bench_client_overhead.py: a real `torch.distributed.pipelining` 1F1B job on CPU
(gloo), trained in blocks of steps alternately without and with the Perseus integration, in one process.

"off": no client call at all (the GPU is released, the daemon has no job). "on": what docs/pytorch.md shows:
claim, `instrument` (registration; the daemon finds the job in its cache and runs its plan at once), steps,
`close`, release. Each block's first steps are discarded (warm-up). Rank 0 writes a JSON report (argv[2]):
per block its mode and step times; then the cost of one reported computation in this process (a wrapped
no-op, paced so no event is dropped); and, with profile set, a cProfile of one more "on" block restricted to
the client library's functions.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import os
import pstats
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from perseus_client import PerseusClient
from perseus_client.torch_pipelining import PipelineInstrumentation, instrument
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

TICKS_S = os.sysconf("SC_CLK_TCK")


def _threads() -> dict[str, float]:
    """This process: CPU seconds of the training thread and of every other thread (ZeroMQ's I/O thread, the
    client's monitor, gloo's), and the training thread's involuntary context switches (preemptions)."""
    main_tid = threading.get_native_id()
    other_s = main_s = 0.0
    preempted = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu_s = (int(fields[11]) + int(fields[12])) / TICKS_S
        if int(task.name) == main_tid:
            main_s = cpu_s
            status = (task / "status").read_text()
            preempted = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        else:
            other_s += cpu_s
    return {"main_cpu_s": main_s, "other_threads_cpu_s": other_s, "main_preempted": preempted}


def build_schedule(config: dict[str, Any], rank: int, world: int) -> Schedule1F1B:
    torch.manual_seed(rank)
    width = config["width"]
    layers: list[nn.Module] = []
    for _ in range(config["layers"]):
        layers += [nn.Linear(width, width), nn.Tanh()]
    stage = PipelineStage(nn.Sequential(*layers), rank, world, torch.device("cpu"))
    return Schedule1F1B(stage, n_microbatches=config["microbatches"], loss_fn=nn.functional.mse_loss)


def run_block(schedule: Schedule1F1B, config: dict[str, Any], rank: int, world: int) -> list[float]:
    """Train `warmup + steps` steps; the step times (s) after the warm-up."""
    rows = config["microbatches"] * config["rows"]
    inputs = torch.randn(rows, config["width"]) if rank == 0 else None
    target = torch.randn(rows, config["width"]) if rank == world - 1 else None
    times: list[float] = []
    for step in range(config["warmup"] + config["steps"]):
        began = time.perf_counter()
        if rank == 0:
            schedule.step(inputs)
        elif rank == world - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        if step >= config["warmup"]:
            times.append(time.perf_counter() - began)
    return times


@contextlib.contextmanager
def leased_gpu(client: PerseusClient) -> Iterator[str]:
    """This rank's GPU, claimed for the block and released after it."""
    gpu = client.gpu_uuid()
    assert gpu is not None
    client.claim([gpu])
    try:
        yield gpu
    finally:
        client.release()


def leased_block(
    schedule: Schedule1F1B,
    client: PerseusClient,
    config: dict[str, Any],
    rank: int,
    world: int,
    *,
    register: bool = True,
) -> list[float]:
    """`run_block` instrumented on the leased GPU: the job registered and run under its plan, or (`register`
    False) the wrappers and the events sent, to a daemon that leases the GPU but runs no job on it."""
    with leased_gpu(client) as gpu, instrument(schedule, client, gpu, register=register):
        return run_block(schedule, config, rank, world)


def hooks_block(schedule: Schedule1F1B, config: dict[str, Any], rank: int, world: int) -> list[float]:
    """The wrappers alone: a fail-open client with no daemon session drops every event at once."""
    client = PerseusClient(config["runtime_dir"], job=config["job"], connect=False)
    with instrument(schedule, client, "GPU-none", register=False):
        times = run_block(schedule, config, rank, world)
    client.close()
    return times


def computation_cost_us(handle: PipelineInstrumentation, pairs: int = 2000) -> float:
    """The integration's own time per reported computation: a wrapped no-op, begin and end sent."""
    wrapped = handle._wrap_computation(lambda *_a, **_k: None, "forward", 0, "fwd_chunk_id")
    handle._in_step = True
    spent_ns = 0
    for batch in range(pairs // 100):
        began = time.perf_counter_ns()
        for microbatch in range(100):
            wrapped(batch * 100 + microbatch)
        spent_ns += time.perf_counter_ns() - began
        time.sleep(0.02)  # paced as training is: the daemon reads everything, nothing is dropped
    handle._in_step = False
    return spent_ns / pairs / 1e3


def client_profile(
    schedule: Schedule1F1B, client: PerseusClient, config: dict[str, Any], rank: int, world: int
) -> dict[str, Any]:
    profiler = cProfile.Profile()
    profiler.enable()
    times = leased_block(schedule, client, config, rank, world)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, name), (_cc, calls, own_s, cumulative_s, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if "perseus_client" in path:
            rows.append(
                {
                    "function": f"{Path(path).name}:{line}:{name}",
                    "calls": calls,
                    "own_s": own_s,
                    "cumulative_s": cumulative_s,
                }
            )
    rows.sort(key=lambda row: -row["own_s"])
    total_s = sum(row["own_s"] for row in rows)
    return {"steps": len(times), "client_own_s": total_s, "step_time_s": sum(times), "top": rows[:8]}


def main() -> None:
    config = json.loads(sys.argv[1])
    rank, world = config["rank"], config["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=world)
    schedule = build_schedule(config, rank, world)
    client = PerseusClient(config["runtime_dir"], job=config["job"], timeout_s=10.0, strict=True)
    if rank == 0:
        client.profile_import(Path(config["profile"]).read_text(), p_block_w=80.0)
    blocks: list[dict[str, Any]] = []
    modes = config["modes"]
    for round_index in range(config["rounds"]):
        shift = round_index % len(modes)
        order = (
            modes[shift:] + modes[:shift] if round_index % 2 == 0 else (modes[shift:] + modes[:shift])[::-1]
        )
        for mode in order:
            dist.barrier()
            before = _threads()
            began_s = time.time()
            if mode == "on":
                times = leased_block(schedule, client, config, rank, world)
            elif mode == "hooks":
                times = hooks_block(schedule, config, rank, world)
            elif mode == "sent":
                times = leased_block(schedule, client, config, rank, world, register=False)
            else:
                times = run_block(schedule, config, rank, world)
            ended_s = time.time()
            used = {key: value - before[key] for key, value in _threads().items()}
            blocks.append({"mode": mode, "step_s": times, "wall_s": [began_s, ended_s], **used})
    report: dict[str, Any] = {"blocks": blocks}
    dist.barrier()
    with leased_gpu(client) as gpu, instrument(schedule, client, gpu, register=False) as handle:
        report["computation_us"] = computation_cost_us(handle)
    if config.get("profile_client"):
        dist.barrier()
        report["client_profile"] = client_profile(schedule, client, config, rank, world)
    report["events_sent"] = client.events_sent
    report["events_carried"] = client.events_carried
    report["events_dropped"] = client.events_dropped
    report["calls_skipped"] = client.calls_skipped
    client.close()
    dist.barrier()
    dist.destroy_process_group()
    Path(sys.argv[2]).write_text(json.dumps(report))
    os._exit(0)


if __name__ == "__main__":
    main()

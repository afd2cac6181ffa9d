"""The GPU side of `benchmarks/gpu_validate.py`: torch, NVML and the daemon (imported only on a GPU machine).

Energy is read from the GPU's counter, which moves every ~100 ms: a measurement keeps the GPU busy and takes
the counter's updates at both ends of a window of at least 1 s (read right after the update, while the work
still runs), so it is the mean power over whole counter periods of steady work; per-execution energy is that
power times the mean execution time, timed separately with synchronization at both ends.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.torch_pipelining import instrument
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from benchmarks.gpu_validate import (
    TARGET_FACTORS,
    SweepRow,
    best_single_clock,
    profile_error,
    target_row,
)
from benchmarks.nvml_probe import _set_reset
from perseusd.gpu.backend import GpuDevice
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.probe import energy_counter_period

JOB = "gpu-validate"
SWEEP_WINDOW_S = 1.2
SWEEP_CALLS = 20
JOB_WINDOW_S = 2.0
DAEMON_READY_S = 30.0
SETTLE_ITERATIONS = 3


def wait_update(device: GpuDevice, timeout_s: float = 1.0) -> tuple[float, float]:
    """(time s, energy J) at the first change of the counter (polled every 1 ms)."""
    start_mj = device.energy_mj()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value_mj = device.energy_mj()
        if value_mj != start_mj:
            return time.monotonic(), value_mj / 1000.0
        time.sleep(0.001)
    return time.monotonic(), device.energy_mj() / 1000.0


def _work_until_update(device: GpuDevice, work: Callable[[], None]) -> tuple[float, float]:
    """Keep the GPU busy with `work` until the counter moves: (time s, energy J) of that update."""
    start_mj = device.energy_mj()
    for _ in range(10_000):
        work()
        value_mj = device.energy_mj()
        if value_mj != start_mj:
            return time.monotonic(), value_mj / 1000.0
    raise RuntimeError("the energy counter did not move")


def busy_power_w(device: GpuDevice, work: Callable[[], None], window_s: float) -> float:
    """Mean power while `work` runs back to back, between two counter updates at least `window_s` apart,
    both read while the GPU is busy (an idle tail would bias it low)."""
    t0, e0 = _work_until_update(device, work)
    while time.monotonic() - t0 < window_s:
        work()
    t1, e1 = _work_until_update(device, work)
    torch.cuda.synchronize()
    return (e1 - e0) / (t1 - t0)


def mean_time_s(work: Callable[[], None], calls: int) -> float:
    """Mean time of `work` over `calls` back-to-back calls, synchronized at both ends."""
    torch.cuda.synchronize()
    begun = time.monotonic()
    for _ in range(calls):
        work()
    torch.cuda.synchronize()
    return (time.monotonic() - begun) / calls


def measure(device: GpuDevice, work: Callable[[], None], window_s: float, calls: int) -> tuple[float, float]:
    """(mean power W while busy, mean time per call s)."""
    work()
    time_s = mean_time_s(work, calls)
    return busy_power_w(device, work, window_s), time_s


def build_stage_module(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    layers = [
        nn.TransformerEncoderLayer(
            args.d_model, 32, 4 * args.d_model, batch_first=True, norm_first=True, dtype=torch.bfloat16
        )
        for _ in range(args.layers)
    ]
    return nn.Sequential(*layers).cuda()


def sweep_clocks(device: GpuDevice, count: int) -> list[int]:
    """`count` clocks from the highest down to half of it, evenly spaced among the supported ones."""
    clocks = [
        c for c in device.info.supported_sm_clocks_mhz if c >= device.info.supported_sm_clocks_mhz[0] // 2
    ]
    step = max(1, (len(clocks) - 1) // (count - 1))
    return clocks[::step][:count]


def locked_sweep(device: GpuDevice, module: nn.Module, x: torch.Tensor, clocks: list[int]) -> list[SweepRow]:
    """Forward and forward+backward of the stage at each locked clock (the ground truth)."""

    def forward() -> None:
        module(x)

    def forward_backward() -> None:
        module(x).float().square().mean().backward()

    rows = []
    for clock in clocks:
        device.set_locked_sm_clock_mhz(clock)
        f_w, f_s = measure(device, forward, SWEEP_WINDOW_S, SWEEP_CALLS)
        fb_w, fb_s = measure(device, forward_backward, SWEEP_WINDOW_S, SWEEP_CALLS)
        module.zero_grad(set_to_none=True)
        rows.append(SweepRow(clock, f_s, f_w * f_s, fb_s - f_s, fb_w * fb_s - f_w * f_s))
    device.reset_locked_sm_clock()
    return rows


def make_schedule(module: nn.Module, microbatches: int) -> Schedule1F1B:
    stage = PipelineStage(module, 0, 1, torch.device("cuda"))
    return Schedule1F1B(
        stage, n_microbatches=microbatches, loss_fn=lambda out, y: (out.float() - y).square().mean()
    )


def job_iterations(
    device: GpuDevice, schedule: Schedule1F1B, batch: torch.Tensor, target: torch.Tensor, count: int
) -> dict[str, float]:
    """`count` iterations back to back: mean iteration time and energy per iteration."""

    def step() -> None:
        schedule.step(batch, target=target)
        schedule._stage.submod.zero_grad(set_to_none=True)

    for _ in range(SETTLE_ITERATIONS):
        step()
    power_w, time_s = measure(device, step, JOB_WINDOW_S, count)
    return {"time_s": time_s, "energy_j": power_w * time_s}


def idle_power_w(device: GpuDevice, clock_mhz: int) -> float:
    device.set_locked_sm_clock_mhz(clock_mhz)
    torch.cuda.synchronize()
    time.sleep(0.3)
    t0, e0 = wait_update(device)
    time.sleep(1.0)
    t1, e1 = wait_update(device)
    return (e1 - e0) / (t1 - t0)


@contextmanager
def daemon(runtime_dir: Path, state_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "perseusd.daemon.main", "--backend", "nvml"]
    command += ["--runtime-dir", str(runtime_dir), "--state-dir", str(state_dir), "--log-level", "WARNING"]
    process = subprocess.Popen(command)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def connect(runtime_dir: Path) -> PerseusClient:
    deadline = time.monotonic() + DAEMON_READY_S
    while True:
        try:
            return PerseusClient(runtime_dir, job=JOB, timeout_s=10.0)
        except (PerseusClientError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def job_info(client: PerseusClient) -> Any:
    return next((j for j in client.jobs().jobs if j.job == JOB), None)


def closed_loop(
    args: argparse.Namespace,
    device: GpuDevice,
    schedule: Schedule1F1B,
    data: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, Any]:
    """The daemon profiles the instrumented job until it runs; then each time target is measured."""
    base = Path(tempfile.mkdtemp(prefix="perseus-gpu-validate-"))
    (base / "run").mkdir()
    (base / "state").mkdir()
    with daemon(base / "run", base / "state"):
        client = connect(base / "run")
        try:
            client.claim([device.info.uuid])
            handle = instrument(schedule, client, device.info.uuid)
            try:
                return _profile_and_run(args, client, device, schedule, data)
            finally:
                handle.close()
        finally:
            client.close()


def _profile_and_run(
    args: argparse.Namespace,
    client: PerseusClient,
    device: GpuDevice,
    schedule: Schedule1F1B,
    data: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, Any]:
    iterations = 0
    info = job_info(client)
    while iterations < args.max_profiling_iterations and (
        info is None or info.state not in ("running", "failed")
    ):
        schedule.step(data[0], target=data[1])
        schedule._stage.submod.zero_grad(set_to_none=True)
        iterations += 1
        info = job_info(client)
    result: dict[str, Any] = {
        "state": None if info is None else info.state,
        "error": None if info is None else info.error,
        "profiling_iterations": None if info is None else (info.profiling or {}).get("iterations"),
        "iterations_run": iterations,
    }
    if info is None or info.state != "running":
        return result
    result["profile_csv"] = client.profile_export(JOB).csv
    runs = {}
    for factor in TARGET_FACTORS:
        client.set_policy("time", args.all_max_s * factor, job=JOB)
        runs[factor] = job_iterations(device, schedule, *data, args.iterations)
    result["runs"] = runs
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    backend = NvmlBackend()
    device = backend.devices()[args.gpu]
    report: dict[str, Any] = {
        "benchmark": "gpu_validate",
        "ok": False,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    try:
        report["probe"] = {
            "info": dataclasses.asdict(device.info),
            "set_reset": _set_reset(device),
            "energy_counter": dataclasses.asdict(energy_counter_period(device, 2.0)),
        }
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1
        )
        module = build_stage_module(args)
        shape = (args.microbatches, args.seq, args.d_model)
        batch = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        target = torch.zeros(*shape, device="cuda")
        one = batch[:1]
        sweep = locked_sweep(device, module, one, sweep_clocks(device, args.sweep_clocks))
        report["sweep"] = [dataclasses.asdict(r) for r in sweep]
        top = device.info.supported_sm_clocks_mhz[0]
        schedule = make_schedule(module, args.microbatches)
        device.set_locked_sm_clock_mhz(top)
        all_max = job_iterations(device, schedule, batch, target, args.iterations)
        idle_w = idle_power_w(device, top)
        singles = {}
        for factor in TARGET_FACTORS[1:]:
            clock = best_single_clock(sweep, all_max["time_s"], factor * all_max["time_s"])
            if clock is not None:
                device.set_locked_sm_clock_mhz(clock)
                singles[factor] = {
                    "clock_mhz": float(clock),
                    **job_iterations(device, schedule, batch, target, args.iterations),
                }
        device.reset_locked_sm_clock()
        report["all_max"] = {**all_max, "idle_w": idle_w}
        args.all_max_s = all_max["time_s"]
        loop = closed_loop(args, device, schedule, (batch, target))
        report["closed_loop"] = {k: v for k, v in loop.items() if k not in ("profile_csv", "runs")}
        if "profile_csv" in loop:
            report["profile_error"] = profile_error(loop["profile_csv"], sweep)
            report["targets"] = [
                target_row(f, loop["runs"][f], all_max, idle_w, singles.get(f)) for f in TARGET_FACTORS
            ]
            report["ok"] = True
    finally:
        try:
            device.reset_locked_sm_clock()
        finally:
            backend.close()
            if dist.is_initialized():
                dist.destroy_process_group()
    return report

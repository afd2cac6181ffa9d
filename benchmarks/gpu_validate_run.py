"""The GPU side of `benchmarks/gpu_validate.py`: torch, NVML and the daemon (imported only on a GPU machine).

Energy is read from the GPU's counter, which moves every ~100 ms: a measurement keeps the GPU busy and takes
the counter's updates at both ends of a window of at least 1 s (read right after the update, while the work
still runs), so it is the mean power over whole counter periods of steady work; per-execution energy is that
power times the mean execution time, timed separately with synchronization at both ends.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.torch_pipelining import instrument
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from benchmarks.gpu_truth import (
    BoundaryRecorder,
    best_single_clock,
    job_truth,
    profile_error,
    stopped_at_exit,
    target_row,
)
from benchmarks.nvml_probe import _set_reset, _switches
from perseusd.emulate.hybrid import SweepRow
from perseusd.gpu.backend import GpuDevice
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.probe import energy_counter_period

JOB = "gpu-validate"
SWEEP_WINDOW_S = 1.2
SWEEP_CALLS = 20
JOB_WINDOW_S = 2.0
TRUTH_WINDOW_S = 1.2
TRUTH_ITERATIONS = 6
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
    device: GpuDevice,
    schedule: Schedule1F1B,
    batch: torch.Tensor,
    target: torch.Tensor,
    count: int,
    window_s: float = JOB_WINDOW_S,
) -> dict[str, float]:
    """`count` iterations back to back: mean iteration time and energy per iteration (the mean power over a
    window of at least `window_s`)."""

    def step() -> None:
        schedule.step(batch, target=target)
        schedule._stage.submod.zero_grad(set_to_none=True)

    for _ in range(SETTLE_ITERATIONS):
        step()
    power_w, time_s = measure(device, step, window_s, count)
    return {"time_s": time_s, "energy_j": power_w * time_s}


def job_sweep(
    device: GpuDevice,
    schedule: Schedule1F1B,
    data: tuple[torch.Tensor, torch.Tensor],
    standalone: list[SweepRow],
    idle_w: float,
    microbatches: int,
) -> list[SweepRow]:
    """The ground truth in the job itself: at each of `standalone`'s clocks, locked, the job's computations
    timed where the GPU reached their boundaries, and its energy over a window of at least 1.2 s
    (`job_truth` splits each pair's energy)."""
    rows = []
    for row in standalone:
        device.set_locked_sm_clock_mhz(row.clock_mhz)
        recorder = BoundaryRecorder()
        handle = instrument(schedule, cast(PerseusClient, recorder), device.info.uuid, register=False)
        try:
            iteration = job_iterations(device, schedule, *data, TRUTH_ITERATIONS, TRUTH_WINDOW_S)
        finally:
            handle.close()
        forward_s, backward_s = recorder.mean_s("forward"), recorder.mean_s("backward")
        rows.append(job_truth(row, forward_s, backward_s, iteration, idle_w, microbatches))
    device.reset_locked_sm_clock()
    return rows


def single_clocks(
    device: GpuDevice,
    schedule: Schedule1F1B,
    data: tuple[torch.Tensor, torch.Tensor],
    truth: list[SweepRow],
    all_max_s: float,
    iterations: int,
    targets: tuple[float, ...],
) -> dict[float, dict[str, float]]:
    """The job locked at the best single clock for each time target above 1 (when one fits)."""
    singles = {}
    for factor in [f for f in targets if f > 1.0]:
        clock = best_single_clock(truth, all_max_s, factor * all_max_s)
        if clock is not None:
            device.set_locked_sm_clock_mhz(clock)
            singles[factor] = {
                "clock_mhz": float(clock),
                **job_iterations(device, schedule, *data, iterations),
            }
    device.reset_locked_sm_clock()
    return singles


def at_all_max(
    device: GpuDevice, schedule: Schedule1F1B, data: tuple[torch.Tensor, torch.Tensor], iterations: int
) -> dict[str, float]:
    device.set_locked_sm_clock_mhz(device.info.supported_sm_clocks_mhz[0])
    try:
        return job_iterations(device, schedule, *data, iterations)
    finally:
        device.reset_locked_sm_clock()


def reference(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """All-max measured before and after the closed loop, averaged: the same job's energy drifts by a few
    percent between minutes (the GPU warms), which is as much as a no-slowdown target can save."""
    return {key: (before[key] + after[key]) / 2.0 for key in ("time_s", "energy_j")}


def idle_power_w(device: GpuDevice, clock_mhz: int) -> float:
    device.set_locked_sm_clock_mhz(clock_mhz)
    torch.cuda.synchronize()
    time.sleep(0.3)
    t0, e0 = wait_update(device)
    time.sleep(1.0)
    t1, e1 = wait_update(device)
    return (e1 - e0) / (t1 - t0)


class LoopTrace:
    """What the daemon saw, recorded beside it for offline study (`--trace-out`): each event the client sends
    (monotonic ns, as the client stamps them), and the energy counter and SM clock polled every ~1 ms
    (changes only)."""

    def __init__(self, device: GpuDevice) -> None:
        self._device = device
        self.events: list[tuple[int, str, int, str, int]] = []
        self.energy: list[tuple[int, int]] = []
        self.clocks: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpu-validate-trace", daemon=True)

    def wrap(self, client: PerseusClient) -> None:
        """Record every computation and step event `client` sends (its methods, replaced on the instance)."""
        for kind in ("computation_begin", "computation_end"):
            send = getattr(client, kind)

            def recorded(
                gpu: str,
                stage: int,
                instruction: str,
                microbatch: int,
                chunk: int = 0,
                *,
                _send: Any = send,
                _kind: str = kind,
            ) -> None:
                self.events.append((time.monotonic_ns(), _kind, stage, instruction, microbatch))
                _send(gpu, stage, instruction, microbatch, chunk)

            setattr(client, kind, recorded)
        for kind in ("step_begin", "step_end"):
            send = getattr(client, kind)

            def step(gpu: str, number: int, *, _send: Any = send, _kind: str = kind) -> None:
                self.events.append((time.monotonic_ns(), _kind, -1, "", number))
                _send(gpu, number)

            setattr(client, kind, step)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _poll(self) -> None:
        while not self._stop.is_set():
            energy_mj = self._device.energy_mj()
            t_ns = time.monotonic_ns()
            if not self.energy or self.energy[-1][1] != energy_mj:
                self.energy.append((t_ns, energy_mj))
            clock_mhz = self._device.sm_clock_mhz()
            if not self.clocks or self.clocks[-1][1] != clock_mhz:
                self.clocks.append((time.monotonic_ns(), clock_mhz))
            time.sleep(0.001)

    def document(self) -> dict[str, Any]:
        return {"events": self.events, "energy_mj": self.energy, "sm_clock_mhz": self.clocks}


@contextmanager
def daemon(runtime_dir: Path, state_dir: Path, log: Path | None) -> Iterator[subprocess.Popen[bytes]]:
    """`perseusd --backend nvml`, its log to `log` at INFO (or to this stderr at WARNING)."""
    command = [sys.executable, "-m", "perseusd.daemon.main", "--backend", "nvml"]
    command += ["--runtime-dir", str(runtime_dir), "--state-dir", str(state_dir)]
    command += ["--log-level", "WARNING" if log is None else "INFO"]
    with contextlib.ExitStack() as stack:
        stderr = None if log is None else stack.enter_context(log.open("ab"))
        yield stack.enter_context(stopped_at_exit(subprocess.Popen(command, stderr=stderr), 20.0))


def connect(runtime_dir: Path) -> PerseusClient:
    deadline = time.monotonic() + DAEMON_READY_S
    while True:
        try:
            return PerseusClient(runtime_dir, job=JOB, timeout_s=10.0, strict=True)
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
    with daemon(base / "run", base / "state", args.daemon_log):
        client = connect(base / "run")
        trace = LoopTrace(device)
        if args.trace_out is not None:
            trace.wrap(client)
            trace.start()
        try:
            client.claim([device.info.uuid])
            handle = instrument(schedule, client, device.info.uuid)
            try:
                return _profile_and_run(args, client, device, schedule, data)
            finally:
                handle.close()
        finally:
            client.close()
            if args.trace_out is not None:
                trace.stop()
                args.trace_out.write_text(json.dumps(trace.document()), encoding="utf-8")


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
        "profiling_iterations": None if info is None or info.profiling is None else info.profiling.iterations,
        "iterations_run": iterations,
    }
    if info is None or info.state != "running":
        return result
    result["profile_csv"] = client.profile_export(JOB).csv
    # The default policy first (no_slowdown, with do-no-harm): what a job that sets nothing runs.
    result["no_slowdown"] = job_iterations(device, schedule, *data, args.iterations)
    result["no_slowdown_plan"] = deployed(job_info(client))
    runs = {}
    plans = {}
    for factor in args.targets:
        client.set_policy("time", args.all_max_s * factor, job=JOB)
        runs[factor] = job_iterations(device, schedule, *data, args.iterations)
        plans[str(factor)] = deployed(job_info(client))
    result["runs"] = runs
    result["plans"] = plans
    return result


def deployed(info: Any) -> dict[str, Any] | None:
    """What the daemon says of the point it deployed (predicted figures, and the clocks it saw applied)."""
    if info is None:
        return None
    names = ("plan_index", "plan_time_s", "plan_energy_j", "all_max_time_s", "all_max_energy_j")
    names += ("clock_changes_per_iteration", "wrong_clock_fraction", "frontier_points", "state", "error")
    names += ("plan_note", "policy")
    return {name: getattr(info, name, None) for name in names}


def save_partial(report: dict[str, Any], out: Path | None) -> None:
    """Write the report so far to `out`, so that a run cut short still leaves what it measured."""
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every step of the check; an exception ends it with `error` (its traceback) in the report."""
    report: dict[str, Any] = {
        "benchmark": "gpu_validate",
        "ok": False,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    try:
        _run(args, report)
    except Exception as error:  # the report says where it failed; the GPU is reset by _run's finally
        report["error"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()
    return report


def _run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    backend = NvmlBackend()
    device = backend.devices()[args.gpu]
    try:
        report["probe"] = {
            "info": dataclasses.asdict(device.info),
            "set_reset": _set_reset(device),
            "energy_counter": dataclasses.asdict(energy_counter_period(device, 2.0)),
            "clock_switch": _switches(device, 3),
        }
        save_partial(report, args.out)
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1
        )
        module = build_stage_module(args)
        shape = (args.microbatches, args.seq, args.d_model)
        data = (
            torch.randn(*shape, device="cuda", dtype=torch.bfloat16),
            torch.zeros(*shape, device="cuda"),
        )
        schedule = make_schedule(module, args.microbatches)
        idle_w = idle_power_w(device, device.info.supported_sm_clocks_mhz[0])
        truth, standalone, singles = _ground_truth(args, device, module, schedule, data, idle_w, report)
        args.all_max_s = report["all_max"]["time_s"]
        loop = closed_loop(args, device, schedule, data)
        report["closed_loop"] = {
            k: v for k, v in loop.items() if k not in ("profile_csv", "runs", "no_slowdown")
        }
        before = report["all_max"]["before"]
        after = at_all_max(device, schedule, data, args.iterations)
        all_max = reference(before, after)
        report["all_max"] = {**all_max, "idle_w": idle_w, "before": before, "after": after}
        if "profile_csv" in loop:
            if truth:
                report["profile_error"] = profile_error(loop["profile_csv"], truth)
                report["profile_error_standalone"] = profile_error(loop["profile_csv"], standalone)
            report["no_slowdown"] = {
                **target_row(1.0, loop["no_slowdown"], all_max, idle_w, None),
                "plan": loop.get("no_slowdown_plan"),
            }
            report["targets"] = [
                target_row(f, loop["runs"][f], all_max, idle_w, singles.get(f)) for f in args.targets
            ]
            report["ok"] = True
            if args.profile_out is not None:
                args.profile_out.write_text(loop["profile_csv"], encoding="utf-8")
    finally:
        try:
            device.reset_locked_sm_clock()
        finally:
            backend.close()
            if dist.is_initialized():
                dist.destroy_process_group()


def _ground_truth(
    args: argparse.Namespace,
    device: GpuDevice,
    module: nn.Module,
    schedule: Schedule1F1B,
    data: tuple[torch.Tensor, torch.Tensor],
    idle_w: float,
    report: dict[str, Any],
) -> tuple[list[SweepRow], list[SweepRow], dict[float, dict[str, float]]]:
    """The sweeps (unless --no-sweep), all-max before the closed loop and the best single clocks."""
    truth: list[SweepRow] = []
    standalone: list[SweepRow] = []
    if not args.no_sweep:
        clocks = sweep_clocks(device, args.sweep_clocks)
        standalone = locked_sweep(device, module, data[0][:1], clocks)
        report["standalone_sweep"] = [dataclasses.asdict(r) for r in standalone]
        truth = job_sweep(device, schedule, data, standalone, idle_w, args.microbatches)
        report["sweep"] = [dataclasses.asdict(r) for r in truth]
        save_partial(report, args.out)
    before = at_all_max(device, schedule, data, args.iterations)
    singles = (
        single_clocks(device, schedule, data, truth, before["time_s"], args.iterations, args.targets)
        if truth
        else {}
    )
    report["all_max"] = {**before, "idle_w": idle_w, "before": before}
    report["single_clocks"] = {str(f): v for f, v in singles.items()}
    save_partial(report, args.out)
    return truth, standalone, singles

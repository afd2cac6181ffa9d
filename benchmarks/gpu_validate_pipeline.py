"""The GPU side of `benchmarks/gpu_validate.py --pipeline` (imported only on a GPU machine).

1. The NVML probe: facts, the energy counter's period, two switches' latency.
2. The real stage alone (the one-stage check's GPT-like layers, one microbatch) swept over locked clocks from
   the top to half of it: its forward and backward time and energy (`gpu_validate_run.locked_sweep`). The
   simulated stages of the pipeline take their costs from this sweep (`perseusd.emulate.hybrid`).
3. `benchmarks/pipeline_check.run_check` with the real GPU: at each position, a `perseusd --backend mixed`,
   `perseus-emulate --real-stage` (the stage runs in its own process on this GPU) and the GPU's SM clock read
   here every ~1 ms.

The GPU's clocks are reset at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import dataclasses
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_validate_run import build_stage_module, locked_sweep, save_partial, sweep_clocks
from benchmarks.nvml_probe import _switches
from benchmarks.pipeline_check import CheckSettings, ClockReader, run_check
from perseusd.emulate.real_stage import RealStageSpec
from perseusd.gpu.backend import GpuDevice, power_capped
from perseusd.gpu.nvml import NvmlBackend
from perseusd.gpu.probe import energy_counter_period


def nvml_reader(device: GpuDevice) -> ClockReader:
    """The real GPU's SM clock and whether the power cap holds it, read through NVML (no privileges)."""

    def read() -> tuple[int, bool]:
        return device.sm_clock_mhz(), power_capped(device.clock_event_reasons())

    return read


def run_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """Every step of the pipeline check; an exception ends it with `error` (its traceback) in the report."""
    report: dict[str, Any] = {
        "benchmark": "gpu_validate",
        "mode": "pipeline",
        "ok": False,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    backend = NvmlBackend()
    device = backend.devices()[args.gpu]
    try:
        report["probe"] = {
            "info": dataclasses.asdict(device.info),
            "energy_counter": dataclasses.asdict(energy_counter_period(device, 1.0)),
            "clock_switch": _switches(device, 2),
        }
        save_partial(report, args.out)
        report["sweep"] = [dataclasses.asdict(r) for r in _sweep(args, device)]
        save_partial(report, args.out)
        settings = CheckSettings(
            real="nvml",
            iterations=args.iterations,
            max_profiling_iterations=min(args.max_profiling_iterations, 120),
            timeout_s=args.run_timeout_s,
            stage=RealStageSpec(args.layers, args.d_model, args.seq),
            keep=None if args.out is None else Path(args.out).parent / "pipeline-runs",
        )
        pipeline: dict[str, Any] = {"positions": []}
        report["pipeline"] = pipeline

        def partial(result: dict[str, Any]) -> None:
            pipeline["positions"].append(result)
            save_partial(report, args.out)

        sweep = [_row(r) for r in report["sweep"]]
        report["pipeline"] = run_check(
            sweep, settings, lambda _run_dir, _uuid: nvml_reader(device), args.positions, partial
        )
        report["ok"] = report["pipeline"]["ok"]
    except Exception as error:  # the report says where it failed; the GPU is reset below
        report["error"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()
    finally:
        try:
            device.reset_locked_sm_clock()
        finally:
            backend.close()
    return report


def _sweep(args: argparse.Namespace, device: GpuDevice) -> list[Any]:
    module = build_stage_module(args)
    x = torch.randn(1, args.seq, args.d_model, device="cuda", dtype=torch.bfloat16)
    try:
        return locked_sweep(device, module, x, sweep_clocks(device, args.sweep_clocks))
    finally:
        del module, x
        torch.cuda.empty_cache()


def _row(row: dict[str, Any]) -> Any:
    from perseusd.emulate.hybrid import SweepRow

    return SweepRow.from_json(row)

"""The closed loop on a real NVIDIA GPU in one command; prints one JSON report.

    sudo python benchmarks/gpu_validate.py [--gpu 0] [--microbatches 8] [--layers 4] [--d-model 4096]
        [--seq 2048] [--sweep-clocks 10] [--iterations 12] [--out report.json] [--markdown report.md]
        [--daemon-log daemon.log] [--profile-out profile.csv] [--trace-out trace.json]

`--layer-sweep` measures per-kind curves instead (`benchmarks/gpu_layer_sweep.py`: matmul, attention,
memory-bound work, embedding and LM head at each vocabulary of `--vocabs`, at `--sweep-clocks` locked clocks):
the measured curves `benchmarks/workload_family.py` composes workloads from, once written to
`docs/gpu-validate/layer-sweep-*.json`.

`--markdown` also writes the report as the Markdown section that docs/gpu-backends.md keeps ("Measured on a
real GPU"). `--trace-out` keeps the closed loop's raw record (events, energy counter, SM clock) for study
offline (tests/profiling/test_h200_traces.py replays two).

Needs root (clock locks), an NVIDIA GPU, `pynvml` and PyTorch with CUDA; takes about 2.5 minutes on an H200.
Without them it refuses with a JSON report saying why (exit 2) and touches nothing. What it does:

1. The NVML probe (`benchmarks/nvml_probe.py`'s facts, a lock and reset, the energy counter's period, the
   latency of three switches).
2. Without the daemon, the ground truth: the job's stage alone at each swept clock (forward, and
   forward+backward, each over a window of at least 1 s); the job itself at each of those clocks (its
   computations timed at their boundaries, its energy over at least 1.2 s, split by the standalone powers:
   `job_truth`); the whole job at all-max clocks and the idle power locked at the top clock; the job locked
   at the best single clock for each time target (the lowest-energy swept clock whose predicted iteration
   time fits it).
3. `perseusd --backend nvml` in a temporary runtime directory, and the job (a one-stage
   `torch.distributed.pipelining` `Schedule1F1B`, GPT-like `TransformerEncoderLayer`s in bf16) through the
   client library (`perseus_client.torch_pipelining.instrument`): online profiling until the job runs, the
   profile it measured against both sweeps, then the job at iteration-time targets of 1.0, 1.15 and 1.3 times
   the all-max time (`set_policy time`: a one-stage job with a time target is what a stage off the critical
   path is). Each target's measured energy per iteration is compared with the all-max job (measured before
   and after the closed loop, averaged) padded to the same time at the top clock's idle power, and with the
   best single clock's.

The GPU's clocks are reset and the daemon stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


TARGET_FACTORS = (1.0, 1.15, 1.3)
EXIT_REFUSED = 2
COUNTS: tuple[tuple[str, int, str | None], ...] = (
    ("--microbatches", 8, None),
    ("--layers", 4, "transformer layers in the stage"),
    ("--d-model", 4096, None),
    ("--seq", 2048, "tokens per microbatch"),
    ("--sweep-clocks", 10, "clocks in the ground-truth sweep"),
    ("--iterations", 12, "measured iterations per run"),
)
"""The job's sizes and the runs' counts, each at least 1: (option, default, help)."""
OUTPUTS: tuple[tuple[str, str], ...] = (
    ("--out", "also write the report here"),
    ("--markdown", "also write the report as a Markdown section for docs/gpu-backends.md"),
    ("--daemon-log", "the daemon log, at INFO (default: stderr)"),
    ("--profile-out", "also write the profile the daemon measured (CSV)"),
    (
        "--trace-out",
        "also write the closed loop's events, energy counter and SM clock (polled every ~1 ms) as JSON",
    ),
)
"""The files the check may also write: (option, help)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU")
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="the pipeline check instead: the stage on the real GPU inside a 4-stage pipeline of simulated "
        "boards, at its first, a middle and its last position (benchmarks/pipeline_check.py)",
    )
    parser.add_argument("--positions", default="0,1,3", help="with --pipeline: the real stage's positions")
    parser.add_argument(
        "--layer-sweep",
        action="store_true",
        help="the layer sweep instead: per kind of computation (matmul, attention, memory-bound, embedding, "
        "LM head) its time and energy at --sweep-clocks locked clocks, for benchmarks/workload_family.py "
        "(benchmarks/gpu_layer_sweep.py)",
    )
    parser.add_argument(
        "--vocabs",
        default="32000,128256",
        help="with --layer-sweep: the vocabularies of embedding and LM head",
    )
    parser.add_argument(
        "--run-timeout-s", type=float, default=240.0, help="with --pipeline: each emulator run's limit"
    )
    parser.add_argument(
        "--targets",
        default=",".join(map(str, TARGET_FACTORS)),
        help="iteration-time targets (x all-max) of the one-stage check (default 1.0,1.15,1.3)",
    )
    parser.add_argument(
        "--no-sweep",
        action="store_true",
        help="one-stage check without the ground-truth sweeps (no profile error, no single clocks): the "
        "closed loop against all-max only",
    )
    for option, default, help_text in COUNTS:
        parser.add_argument(option, type=int, default=default, help=help_text)
    parser.add_argument("--max-profiling-iterations", type=int, default=300)
    for option, help_text in OUTPUTS:
        parser.add_argument(option, type=Path, help=help_text)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for option, _default, _help in COUNTS:
        if getattr(args, option[2:].replace("-", "_")) < 1:
            build_parser().error(f"{option} must be >= 1")
    if args.sweep_clocks < 3:
        build_parser().error("--sweep-clocks must be >= 3 (a curve needs three clocks)")
    try:
        args.targets = tuple(float(t) for t in args.targets.split(","))
        args.positions = tuple(int(p) for p in args.positions.split(","))
        args.vocabs = tuple(int(v) for v in args.vocabs.split(","))
    except ValueError:
        build_parser().error("--targets, --positions and --vocabs are comma-separated numbers")
    return args


def refusal() -> str | None:
    """Why this machine cannot run the check (None: it can). Touches no GPU state."""
    if os.geteuid() != 0:
        return "needs root: locking GPU clocks needs root or CAP_SYS_ADMIN (run it with sudo)"
    try:
        import pynvml  # noqa: F401  (only perseusd.gpu.nvml uses it; this only checks it is there)
    except ImportError:
        return "needs pynvml: pip install 'perseusd[nvml]'"
    try:
        import torch
    except ImportError:
        return "needs PyTorch with CUDA"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch"
    try:
        import torch.distributed.pipelining  # PyTorch 2.4 or later
    except ImportError:
        return "needs PyTorch 2.4 or later (torch.distributed.pipelining)"
    from perseusd.errors import GpuError
    from perseusd.gpu.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except (GpuError, OSError) as error:
        return f"NVML is not usable: {error}"
    try:
        if not backend.devices():
            return "NVML sees no GPU"
    finally:
        backend.close()
    return None


def refused_report(reason: str) -> dict[str, Any]:
    return {"benchmark": "gpu_validate", "ok": False, "refused": reason}


def _fmt(value: Any, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as the Markdown section docs/gpu-backends.md keeps: the GPU, the profiling, the profile's
    error and one row per time target (a refused or failed run says so)."""
    lines = ["### Measured on a real GPU (`benchmarks/gpu_validate.py`)", ""]
    if report.get("mode") == "pipeline" and report.get("pipeline"):
        from benchmarks.pipeline_check import markdown as pipeline_markdown

        return "\n".join([*lines, pipeline_markdown(report["pipeline"])])
    if report.get("refused"):
        return "\n".join([*lines, f"Refused: {report['refused']}", ""])
    info = (report.get("probe") or {}).get("info") or {}
    clocks = info.get("supported_sm_clocks_mhz") or []
    args = report.get("args") or {}
    lines.append(
        f"{info.get('name', 'GPU ?')}, {len(clocks)} SM clocks"
        + (f" ({min(clocks)}-{max(clocks)} MHz)" if clocks else "")
        + f"; job: 1 stage, {args.get('layers', '?')} layers, d_model {args.get('d_model', '?')}, "
        + f"{args.get('microbatches', '?')} microbatches of {args.get('seq', '?')} tokens."
    )
    all_max = report.get("all_max") or {}
    loop = report.get("closed_loop") or {}
    before, after = all_max.get("before") or {}, all_max.get("after") or {}
    drift = (
        f" (the mean of {_fmt(before.get('energy_j'), 1, ' J')} before the closed loop and "
        f"{_fmt(after.get('energy_j'), 1, ' J')} after)"
        if before and after
        else ""
    )
    lines += [
        "",
        f"- All-max: {_fmt(all_max.get('time_s'), 4, ' s')}, {_fmt(all_max.get('energy_j'), 1, ' J')} per "
        f"iteration{drift}; idle {_fmt(all_max.get('idle_w'), 1, ' W')} at the top clock.",
        f"- Online profiling: {loop.get('profiling_iterations', '-')} iterations, job state "
        f"`{loop.get('state')}`" + (f" ({loop['error']})" if loop.get("error") else "") + ".",
    ]
    error = report.get("profile_error")
    if error:
        worst_s, worst_j = error.get("worst_time_err"), error.get("worst_energy_err")
        lines.append(
            f"- Profile against the job's own locked-clock sweep: worst time error "
            f"{_fmt(None if worst_s is None else 100 * worst_s, 1, ' %')}, worst energy error "
            f"{_fmt(None if worst_j is None else 100 * worst_j, 1, ' %')} (bounds 2 % and 3 %: "
            f"{'met' if error.get('within_bounds') else 'not met'})."
        )
    default = report.get("no_slowdown")
    if default:
        note = (default.get("plan") or {}).get("plan_note") or "the plan as solved"
        lines.append(
            f"- Default policy (`no_slowdown`): {default['time_s']} s, {default['energy_j']} J per "
            f"iteration, {_fmt(default['saving_pct'], 2, ' %')} against all-max padded to its time ({note})."
        )
    targets = report.get("targets") or []
    if targets:
        lines += [
            "",
            "| target (x all-max) | time (s) | energy (J) | all-max padded (J) | saving | best single clock "
            "| its saving | share of it |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in targets:
            single = row.get("single_clock") or {}
            clock = single.get("clock_mhz")
            lines.append(
                f"| {row['factor']} | {row['time_s']} | {row['energy_j']} | {row['all_max_padded_j']} | "
                f"{_fmt(row['saving_pct'], 2, ' %')} | {'-' if clock is None else f'{clock:.0f} MHz'} | "
                f"{_fmt(single.get('saving_pct'), 2, ' %')} | {_fmt(row.get('of_single_clock_saving'), 2)} |"
            )
    if not report.get("ok"):
        lines += ["", "The run did not complete: see the JSON report."]
    return "\n".join([*lines, ""])


def emit(report: Mapping[str, Any], out: Path | None, markdown_out: Path | None = None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    if markdown_out is not None:
        markdown_out.write_text(markdown(report), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = refusal()
    if reason is not None:
        emit(refused_report(reason), args.out, args.markdown)
        return EXIT_REFUSED
    if args.layer_sweep:
        from benchmarks.gpu_layer_sweep import run_layer_sweep  # torch and NVML from here on

        report = run_layer_sweep(args)
        emit(report, args.out)
        return 0
    if args.pipeline:
        from benchmarks.gpu_validate_pipeline import run_pipeline  # torch and NVML from here on

        report = run_pipeline(args)
    else:
        from benchmarks.gpu_validate_run import run  # torch and NVML from here on

        report = run(args)
    emit(report, args.out, args.markdown)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

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
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseusd.emulate.hybrid import SweepRow  # the ground truth at one locked clock

TARGET_FACTORS = (1.0, 1.15, 1.3)
EXIT_REFUSED = 2


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
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4, help="transformer layers in the stage")
    parser.add_argument("--d-model", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=2048, help="tokens per microbatch")
    parser.add_argument("--sweep-clocks", type=int, default=10, help="clocks in the ground-truth sweep")
    parser.add_argument("--iterations", type=int, default=12, help="measured iterations per run")
    parser.add_argument("--max-profiling-iterations", type=int, default=300)
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument(
        "--markdown", type=Path, help="also write the report as a Markdown section for docs/gpu-backends.md"
    )
    parser.add_argument("--daemon-log", type=Path, help="the daemon log, at INFO (default: stderr)")
    parser.add_argument("--profile-out", type=Path, help="also write the profile the daemon measured (CSV)")
    parser.add_argument(
        "--trace-out",
        type=Path,
        help="also write the closed loop's events, energy counter and SM clock (polled every ~1 ms) as JSON",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name in ("microbatches", "layers", "d_model", "seq", "sweep_clocks", "iterations"):
        if getattr(args, name) < 1:
            build_parser().error(f"--{name.replace('_', '-')} must be >= 1")
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


@contextlib.contextmanager
def stopped_at_exit(process: subprocess.Popen[bytes], grace_s: float) -> Iterator[subprocess.Popen[bytes]]:
    """Yield `process`; on the way out SIGTERM it (a daemon restores its GPUs), SIGKILL after `grace_s`."""
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def sweep_at(sweep: Sequence[SweepRow], clock_mhz: int) -> SweepRow | None:
    """The sweep at `clock_mhz`, linear between swept clocks; None outside the swept range."""
    rows = sorted(sweep, key=lambda r: r.clock_mhz)
    for row in rows:
        if row.clock_mhz == clock_mhz:
            return row
    for low, high in itertools.pairwise(rows):
        if low.clock_mhz < clock_mhz < high.clock_mhz:
            w = (clock_mhz - low.clock_mhz) / (high.clock_mhz - low.clock_mhz)
            values = [
                a + w * (b - a)
                for a, b in zip(
                    (low.forward_s, low.forward_j, low.backward_s, low.backward_j),
                    (high.forward_s, high.forward_j, high.backward_s, high.backward_j),
                    strict=True,
                )
            ]
            return SweepRow(clock_mhz, *values)
    return None


def profile_error(profile_csv: str, sweep: Sequence[SweepRow]) -> dict[str, Any]:
    """Each row of the daemon's profile against the sweep: relative time and energy errors, and the worst."""
    rows: list[dict[str, Any]] = []
    for line in profile_csv.strip().splitlines()[1:]:
        stage, instruction, clock, time_s, energy_j = line.split(",")
        truth = sweep_at(sweep, int(clock))
        if truth is None:
            rows.append({"instruction": instruction, "clock_mhz": int(clock), "outside_sweep": True})
            continue
        true_s, true_j = (
            (truth.forward_s, truth.forward_j)
            if instruction == "forward"
            else (truth.backward_s, truth.backward_j)
        )
        rows.append(
            {
                "stage": int(stage),
                "instruction": instruction,
                "clock_mhz": int(clock),
                "time_err": round(float(time_s) / true_s - 1.0, 4),
                "energy_err": round(float(energy_j) / true_j - 1.0, 4),
            }
        )
    compared = [r for r in rows if "time_err" in r]
    return {
        "rows": rows,
        "worst_time_err": max((abs(r["time_err"]) for r in compared), default=None),
        "worst_energy_err": max((abs(r["energy_err"]) for r in compared), default=None),
        "within_bounds": bool(compared)
        and all(abs(r["time_err"]) <= 0.02 and abs(r["energy_err"]) <= 0.03 for r in compared),
    }


class BoundaryRecorder:
    """Stands in for the client while the job runs without the daemon (`instrument(..., register=False)`):
    keeps the computation boundaries the instrumentation reports, stamped when they arrive (on a GPU, when
    the GPU reached them), to time each computation of the job itself at a locked clock."""

    def __init__(self) -> None:
        self._begun: dict[tuple[str, int], int] = {}
        self.durations_s: dict[str, list[float]] = {}

    def computation_begin(
        self, _gpu: str, _stage: int, instruction: str, microbatch: int, _chunk: int = 0
    ) -> None:
        self._begun[(instruction, microbatch)] = time.monotonic_ns()

    def computation_end(
        self, _gpu: str, _stage: int, instruction: str, microbatch: int, _chunk: int = 0
    ) -> None:
        begun_ns = self._begun.pop((instruction, microbatch), None)
        if begun_ns is not None:
            self.durations_s.setdefault(instruction, []).append((time.monotonic_ns() - begun_ns) / 1e9)

    def step_begin(self, _gpu: str, _step: int) -> None:
        """Steps are timed by the caller."""

    def step_end(self, _gpu: str, _step: int) -> None:
        """Steps are timed by the caller."""

    def mean_s(self, instruction: str) -> float:
        """Mean duration of `instruction`'s computations (the middle 90 %: a stall is not the clock's)."""
        durations = sorted(self.durations_s.get(instruction, []))
        if not durations:
            raise ValueError(f"no {instruction} computation was recorded")
        cut = len(durations) // 20
        kept = durations[cut : len(durations) - cut]
        return sum(kept) / len(kept)


def job_truth(
    standalone: SweepRow,
    forward_s: float,
    backward_s: float,
    iteration: Mapping[str, float],
    idle_w: float,
    microbatches: int,
) -> SweepRow:
    """One clock's ground truth in the job itself: its computations' mean times, and its energy per
    forward+backward pair (the iteration's, less its idle time at `idle_w`, per microbatch), split between
    forward and backward in the ratio of their powers measured alone (`standalone`, the same clock): a
    one-stage job runs them back to back, so no counter can split them in place."""
    idle_s = max(0.0, iteration["time_s"] - microbatches * (forward_s + backward_s))
    pair_j = (iteration["energy_j"] - idle_w * idle_s) / microbatches
    forward_w = standalone.forward_j / standalone.forward_s
    backward_w = standalone.backward_j / standalone.backward_s
    forward_j = pair_j * forward_w * forward_s / (forward_w * forward_s + backward_w * backward_s)
    return SweepRow(standalone.clock_mhz, forward_s, forward_j, backward_s, pair_j - forward_j)


def padded_energy_j(all_max_j: float, all_max_s: float, idle_w: float, time_s: float) -> float:
    """The all-max iteration's energy padded with idle power to `time_s` (never less than all-max's)."""
    return all_max_j + idle_w * max(0.0, time_s - all_max_s)


def best_single_clock(sweep: Sequence[SweepRow], all_max_s: float, target_s: float) -> int | None:
    """The lowest-energy swept clock whose iteration, scaled from all-max by the stage's compute time,
    fits `target_s` (None when none does)."""
    top = max(sweep, key=lambda r: r.clock_mhz)
    top_s = top.forward_s + top.backward_s
    fitting = [r for r in sweep if all_max_s * (r.forward_s + r.backward_s) / top_s <= target_s]
    if not fitting:
        return None
    return min(fitting, key=lambda r: r.forward_j + r.backward_j).clock_mhz


def saving_pct(energy_j: float, reference_j: float) -> float:
    return round(100.0 * (1.0 - energy_j / reference_j), 2)


def target_row(
    factor: float,
    measured: Mapping[str, float],
    all_max: Mapping[str, float],
    idle_w: float,
    single: Mapping[str, float] | None,
) -> dict[str, Any]:
    """One target's line: the daemon's run against all-max padded to its time, and the single clock's."""
    reference_j = padded_energy_j(all_max["energy_j"], all_max["time_s"], idle_w, measured["time_s"])
    row: dict[str, Any] = {
        "factor": factor,
        "target_s": round(factor * all_max["time_s"], 4),
        "time_s": round(measured["time_s"], 4),
        "energy_j": round(measured["energy_j"], 2),
        "all_max_padded_j": round(reference_j, 2),
        "saving_pct": saving_pct(measured["energy_j"], reference_j),
        "single_clock": None,
        "of_single_clock_saving": None,
    }
    if single is not None:
        single_ref_j = padded_energy_j(all_max["energy_j"], all_max["time_s"], idle_w, single["time_s"])
        single_saving = saving_pct(single["energy_j"], single_ref_j)
        row["single_clock"] = {**{k: round(v, 4) for k, v in single.items()}, "saving_pct": single_saving}
        if single_saving > 0:
            row["of_single_clock_saving"] = round(row["saving_pct"] / single_saving, 3)
    return row


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

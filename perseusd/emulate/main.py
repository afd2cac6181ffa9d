"""`perseus-emulate`: run an emulated pipeline-training job against perseusd on simulated GPUs.

    perseus-emulate --profile FILE|a100_sxm|a40|h100_sxm --stages S --microbatches M [--pipelines P]
                    [--schedule 1f1b|gpipe|interleaved|interleaved_zb|zbv|observed] [--chunks C]
                    [--iterations N]
                    [--time-scale X] --runtime-dir DIR [--runtime-dir DIR2 ...]
                    [--straggler PIPELINE:FACTOR[:FROM[:TO]]] [--no-dp-sync] [--json] ...

Exit status: 0 when the run finished, 1 when it failed (a stage failed, the daemon failed the job, a timeout,
SIGINT/SIGTERM), 2 on usage errors (bad arguments, or arguments that do not fit the daemon).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.protocol import CONTROL_SOCKET_NAME

from perseusd.argtypes import positive_float, positive_int
from perseusd.emulate.coordinator import Coordinator, CoordinatorOptions, ProfileToImport
from perseusd.emulate.daemons import Daemons
from perseusd.emulate.phases import SETTLE_ITERATIONS, STRAGGLER_SETTLE_ITERATIONS, PhaseConfig
from perseusd.emulate.preflight import (
    PLACEMENTS,
    EmulateError,
    UsageError,
    check_shape,
    lay_out,
    load_profile,
    scaled_profile_csv,
)
from perseusd.emulate.processes import RunSettings, StageGroup
from perseusd.emulate.real_stage import RealStageSpec
from perseusd.emulate.report import RunDescription, header, row_line, summary, to_json
from perseusd.emulate.results import IterationRow
from perseusd.emulate.straggler import StragglerSpec, parse_straggler
from perseusd.emulate.topology import SCHEDULES, PipelineShape
from perseusd.emulate.trace import TraceWriter
from perseusd.planner.policy import POLICIES

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
CONTROL_TIMEOUT_S = 5.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perseus-emulate",
        description="Run an emulated pipeline-parallel training job on perseusd's simulated GPUs: a baseline "
        "at all-max clocks, then the daemon's closed loop (profile, solve, run the plan); report the saving.",
    )
    add = parser.add_argument
    add(
        "--profile",
        required=True,
        help="a profile CSV, or a bundled one (a100_sxm, a40, h100_sxm); its clocks must be the board's",
    )
    add("--stages", type=positive_int, required=True, help="pipeline stages (GPUs per pipeline)")
    add("--microbatches", type=positive_int, required=True, help="microbatches per iteration")
    add("--pipelines", type=positive_int, default=1, help="data-parallel pipelines (default 1)")
    add("--schedule", choices=SCHEDULES, default="1f1b", help="default 1f1b; observed runs 1F1B")
    add("--chunks", type=positive_int, default=1, help="model chunks per GPU (interleaved only)")
    add("--iterations", type=positive_int, default=10, help="measured iterations per phase (default 10)")
    add(
        "--baseline-iterations",
        type=positive_int,
        help="measured baseline iterations (default: --iterations)",
    )
    add("--time-scale", type=positive_float, default=1.0, help="computation time factor (default 1: real)")
    add(
        "--runtime-dir",
        type=Path,
        action="append",
        required=True,
        help="the runtime directory of a perseusd --backend sim; give it once per daemon (node): pipelines "
        "go to the daemons in contiguous blocks, or with more daemons than pipelines each pipeline's stages "
        "spread over them (see --placement)",
    )
    add(
        "--placement",
        choices=PLACEMENTS,
        help="pipelines: whole pipelines per daemon; stages: stage-major, every pipeline spans the daemons "
        "(default: pipelines when there are at least as many pipelines as daemons, else stages)",
    )
    add(
        "--tensor-parallel",
        type=positive_int,
        default=1,
        help="GPUs per stage (on the stage's daemon), running every computation in step (default 1)",
    )
    add("--job", help="job name (default emulate-<pid>)")
    add("--policy", choices=POLICIES, help="the frontier point the daemon runs (default: the daemon's)")
    add("--target", type=float, default=0.0, help="slowdown fraction or time (s) for --policy")
    add("--baseline-only", action="store_true", help="measure the baseline only (no registration)")
    add(
        "--import-profile",
        action="store_true",
        help="give the daemon the profile (time-scaled) before registering: the job skips online profiling",
    )
    add(
        "--max-profiling-iterations",
        type=positive_int,
        default=500,
        help="fail when the job is not running after this many closed-loop iterations (default 500)",
    )
    add(
        "--straggler",
        type=parse_straggler,
        metavar="PIPELINE:FACTOR[:FROM[:TO]]",
        help="pipeline PIPELINE runs FACTOR (>= 1) times slower during the baseline and, in the closed loop, "
        "from FROM (default 0) to TO (default: the end) iterations after the job runs",
    )
    add(
        "--settle-iterations",
        type=positive_int,
        help=f"iterations between the job running and the optimized window (default {SETTLE_ITERATIONS}; "
        f"with --straggler FROM + {STRAGGLER_SETTLE_ITERATIONS})",
    )
    add(
        "--no-dp-sync",
        dest="dp_sync",
        action="store_false",
        help="pipelines do not wait for each other at the end of an iteration (no gradient all-reduce)",
    )
    add("--timeout-s", type=positive_float, default=900.0, help="fail after this long (default 900)")
    add(
        "--real-stage",
        type=int,
        metavar="K",
        help="pipeline 0's stage K runs real PyTorch layers on the daemon's first GPU, the real one of a "
        "perseusd --backend mixed (a simulated stand-in runs the profile's costs instead)",
    )
    add("--real-layers", type=positive_int, default=4, help="the real stage's transformer layers (default 4)")
    add("--real-d-model", type=positive_int, default=4096, help="their width (default 4096)")
    add("--real-seq", type=positive_int, default=2048, help="tokens per microbatch (default 2048)")
    add(
        "--real-device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the real stage's layers run (cpu: the layers on the CPU beside a stand-in board, to try "
        "the real stage's code without a GPU; the board then sees none of their energy)",
    )
    add("--trace", type=Path, help="append every computation and counter sample to FILE (JSON lines)")
    add("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    add("--json-file", type=Path, help="also write the JSON object to FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _sigterm_interrupts():
            return _run(args)
    except UsageError as exc:
        print(f"perseus-emulate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (EmulateError, PerseusClientError) as exc:
        print(f"perseus-emulate: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("perseus-emulate: interrupted; the stages released their GPUs", file=sys.stderr)
        return EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    shape = PipelineShape(args.stages, args.microbatches, args.chunks, args.schedule)
    check_shape(shape)
    straggler = _check_straggler(args.straggler, args.pipelines)
    profile = load_profile(args.profile, shape)
    job = args.job or f"emulate-{os.getpid()}"
    with _connect_all(args.runtime_dir, job) as clients:
        layout = lay_out(
            clients,
            shape,
            args.pipelines,
            profile,
            args.time_scale,
            args.real_stage,
            tensor_parallel=args.tensor_parallel,
            placement=args.placement,
        )
        run = RunDescription(job, layout, args.schedule, args.time_scale, straggler, args.dp_sync)
        progress = sys.stderr if args.json else sys.stdout
        print(header(run), file=progress, flush=True)
        phases = _phase_config(args, straggler)
        settings = RunSettings(
            job,
            args.schedule,
            args.time_scale,
            _trace_path(args.trace),
            dp_sync=args.dp_sync,
            straggler=straggler,
            warmup_iterations=phases.warmup_iterations,
            real=RealStageSpec(args.real_layers, args.real_d_model, args.real_seq, args.real_device),
        )
        imported = None
        if args.import_profile:
            csv = scaled_profile_csv(profile, shape, args.time_scale)
            imported = ProfileToImport(csv, profile.source, layout.board.blocking_power_w)
        options = CoordinatorOptions(job, phases, args.timeout_s, args.policy, args.target, imported)
        trace = TraceWriter(args.trace)
        try:
            coordinator = Coordinator(
                Daemons(clients, job),
                layout,
                StageGroup(layout, settings),
                options,
                _printer(progress),
                trace,
            )
            result = coordinator.run()
        finally:
            trace.close()
    document = json.dumps(to_json(run, result), indent=2)
    if args.json_file is not None:
        args.json_file.write_text(document + "\n", encoding="utf-8")
    if args.json:
        print(document)
    else:
        print(summary(run, result))
    if result.failure:
        raise EmulateError(result.failure)
    return EXIT_OK


def _check_straggler(straggler: StragglerSpec | None, pipelines: int) -> StragglerSpec | None:
    if straggler is not None and straggler.pipeline >= pipelines:
        raise UsageError(
            f"--straggler pipeline {straggler.pipeline} does not exist: pipelines are 0..{pipelines - 1}"
        )
    return straggler


def _phase_config(args: argparse.Namespace, straggler: StragglerSpec | None) -> PhaseConfig:
    settle = args.settle_iterations
    if settle is None:
        settle = (
            SETTLE_ITERATIONS
            if straggler is None
            else straggler.from_iterations + STRAGGLER_SETTLE_ITERATIONS
        )
    return PhaseConfig(
        baseline_iterations=args.baseline_iterations or args.iterations,
        iterations=args.iterations,
        max_profiling_iterations=args.max_profiling_iterations,
        baseline_only=args.baseline_only,
        settle_iterations=settle,
    )


def _trace_path(path: Path | None) -> str | None:
    return None if path is None else str(path.resolve())


def _printer(stream: TextIO) -> Callable[[IterationRow], None]:
    def print_row(row: IterationRow) -> None:
        print(row_line(row), file=stream, flush=True)

    return print_row


@contextmanager
def _connect_all(runtime_dirs: Sequence[Path], job: str) -> Iterator[list[PerseusClient]]:
    """One client per daemon; the same daemon twice is a usage error."""
    resolved = [path.resolve() for path in runtime_dirs]
    if len(set(resolved)) != len(resolved):
        raise UsageError("the same --runtime-dir is given twice: give each daemon once")
    with ExitStack() as stack:
        yield [stack.enter_context(_connect(path, job)) for path in runtime_dirs]


@contextmanager
def _connect(runtime_dir: Path, job: str) -> Iterator[PerseusClient]:
    hint = f"start `perseusd --backend sim --sim-gpus N --runtime-dir {runtime_dir}` or fix --runtime-dir"
    if not (runtime_dir / CONTROL_SOCKET_NAME).exists():
        raise UsageError(f"no perseusd at {runtime_dir} ({CONTROL_SOCKET_NAME} is missing): {hint}")
    try:
        client = PerseusClient(runtime_dir, job, timeout_s=CONTROL_TIMEOUT_S, strict=True)
    except PerseusClientError as exc:
        raise UsageError(f"perseusd does not answer at {runtime_dir} ({exc.message}): {hint}") from None
    try:
        yield client
    finally:
        client.close()


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C: the stages are shut down and release their GPUs."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())

"""The closed loop measured end to end: a real daemon on simulated GPUs and `perseus-emulate`; prints JSON.

For each case a fresh daemon (`--backend sim --sim-model BOARD`, fresh job cache) and one emulated job: the
all-max baseline, then online profiling, solving and the deployed plan, all measured from the simulated GPUs'
energy counters in the same invocation. Cases:

- GPT-3 175B on the A100 SXM board with 8 stages and 12, 24 and 48 microbatches, and on the A40 with 12
  (the published intrinsic saving for A100 8x12 is 15.2 %, no slowdown);
- the `h100_sxm` board (power capping, 9-15 ms clock locks, clock-dependent idle power) with the GPT 4-stage
  profile measured on a real H100, 8 and 16 microbatches (`h100x8`, `h100x16`; run them at `--time-scale 1`:
  the lock latency does not scale);
- the `h100_sxm` board with a synthetic profile (`synthx8`, see `synthetic_profile_csv`): not a measurement,
  a second workload to check that profiling, solving and switching generalise;
- any other profile, written as a case `BOARD:PROFILE:STAGES:MICROBATCHES` (PROFILE a CSV file in the
  profile format, at the board's clocks, or a bundled name), e.g. an H100 profile of another model:
  `--cases h100_sxm:llama-h100.csv:4:8`.

Each result has a `summary`: profiling iterations, the planned saving (the daemon's plan against its all-max,
both predicted from the profile it measured), the measured saving and slowdown against the all-max baseline
measured in the same run, clock changes per iteration and the fraction of computations that began before
their planned clock was applied: by the daemon's count (`began_before_clock_fraction`) and, with
`--trace-dir`, by the simulated GPUs' own clock at each begin against the plan the daemon ran
(`began_at_wrong_gpu_clock_fraction`; `wrong_clock_fraction` is the one judged, `wrong_clock_source` says
which) and the saving by the simulated GPUs' exact energy (`exact_saving_pct`, and `measurement_error_pts`:
the counters' figure less it), and `bars`: each of the closed-loop issue's thresholds (profiling at most 80
iterations, at least 90 % of the shipped-profile no-slowdown saving, slowdown at most 1 %, at most 10 % of
computations begun at a wrong clock) with whether this run met it. For a measured profile (bundled or a
file) it adds the planner's own no-slowdown saving
(`perseusctl compare`'s "Perseus, no slowdown") on two profiles, and the measured saving as a share of each:
`reference_shipped_pct` on the shipped profile (what the issue's 16.6 / 18.5 % for the H100 come from) and
`reference_board_pct` on the board's effective costs (the shipped profile as the board runs it: on the
`h100_sxm` board a computation drawing over the power limit runs at a lower clock, forward and backward
each on its own, so the top clocks cost what the board really runs). Both use the daemon's unit time and
the board's idle power at its top clock. On a board with a lock latency, `reference_switch_aware_pct` is the
best followable plan the daemon's own solve finds on the board's costs (`benchmarks/switch_reference.py`),
at the profile's clocks or at every clock of the board (`board_true_profile`: the daemon's sweep goes below
the profile's clocks where light stages wait), whichever saves more.

    python benchmarks/bench_closed_loop.py [--cases a100x12,...,synthx8,BOARD:PROFILE:STAGES:MICROBATCHES]
        [--time-scale 1.0] [--iterations 8] [--pipelines 1] [--timeout-s 3600] [--trace-dir DIR]
        [--seeds 0,1,2] [--parallel N] [--jsonl FILE]

With `--trace-dir`, `benchmarks/closed_loop_trace.py DIR/CASE.jsonl` tells a case's slowdown apart: the
plan's clocks (the DAG with the measured durations) and the time between stages (docs/emulate.md); the
profile the daemon measured is kept beside it (`DIR/CASE.profile.csv`; the result's `measured_profile` says
its blocking power), so the run's frontier and plan can be solved again offline, and the daemon's log
(`DIR/CASE.daemon.log`: per stage, which keys' clocks were filled and why the others were not).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.closed_loop_suite import FAMILY_PREFIX, family_bars, family_case, family_csv, family_spec
from benchmarks.closed_loop_trace import exact_energy, gpu_wrong_clock_fraction
from benchmarks.h100_variants import VARIANTS, variant_csv, variant_stages
from benchmarks.switch_reference import switch_aware_pct
from perseusd.emulate.trace import read_trace
from perseusd.gpu.sim_boards import load_board
from perseusd.jobs.solving import auto_unit_time_s
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import read_profile, read_profile_stream, write_profile
from perseusd.profiling.estimator import OptionEstimate
from perseusd.profiling.sweep import pareto_options
from perseusd.workload.sim_costs import ComputationCost, WorkloadCosts
from tests.support import perseusd_proc
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess

perseusd_proc.READY_TIMEOUT_S = 120.0  # a loaded machine starts a daemon slowly; tests keep their 15 s

SYNTHETIC = "synthetic"
VARIANT = "variant:"

CASES: dict[str, tuple[str, str, int, int]] = {
    "a100x12": ("a100_sxm", "a100_sxm", 8, 12),
    "a100x24": ("a100_sxm", "a100_sxm", 8, 24),
    "a100x48": ("a100_sxm", "a100_sxm", 8, 48),
    "a40x12": ("a40", "a40", 8, 12),
    "h100x8": ("h100_sxm", "h100_sxm", 4, 8),
    "h100x16": ("h100_sxm", "h100_sxm", 4, 16),
    "synthx8": ("h100_sxm", SYNTHETIC, 4, 8),
    **{f"h100-{name}x8": ("h100_sxm", f"{VARIANT}{name}", variant_stages(name), 8) for name in VARIANTS},
}
"""name -> (board, profile: a bundled name, SYNTHETIC or VARIANT + a `h100_variants` name, stages,
microbatches)."""

BUNDLED_PROFILES = ("a100_sxm", "a40", "h100_sxm")

BARS: dict[str, tuple[str, str, float]] = {
    "profiling_iterations": ("profiling_iterations", "<=", 80),
    "of_shipped_reference": ("of_shipped_reference", ">=", 0.90),
    "slowdown_pct": ("slowdown_pct", "<=", 1.0),
    "wrong_clock_fraction": ("wrong_clock_fraction", "<=", 0.10),
}
"""The closed-loop issue's thresholds: bar -> (summary field, comparison, limit)."""


def case_spec(name: str) -> tuple[str, str, int, int]:
    """A named case, or `BOARD:PROFILE:STAGES:MICROBATCHES` (PROFILE a CSV path or a bundled name)."""
    if name in CASES:
        return CASES[name]
    if name.startswith(FAMILY_PREFIX):
        return family_spec(name)
    parts = name.rsplit(":", 3)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        raise SystemExit(
            f"unknown case {name!r}: one of {', '.join(CASES)} or BOARD:PROFILE:STAGES:MICROBATCHES"
        )
    board, profile, stages, microbatches = parts
    if profile not in BUNDLED_PROFILES and not Path(profile).is_file():
        raise SystemExit(f"case {name!r}: no profile file {profile!r}")
    return board, profile, int(stages), int(microbatches)


def shipped_profile(profile: str) -> Profile:
    """A bundled profile by name, a variant (`h100_variants`), else the profile CSV at that path."""
    if profile.startswith(VARIANT):
        text = variant_csv(profile.removeprefix(VARIANT))
        return read_profile_stream(io.StringIO(text, newline=""), source=profile)
    if profile.startswith(FAMILY_PREFIX):
        return read_profile_stream(io.StringIO(family_csv(profile), newline=""), source=profile)
    return bundled_profile(profile) if profile in BUNDLED_PROFILES else read_profile(profile)


def synthetic_profile_csv() -> str:
    """A synthetic 4-stage profile for the H100 board (made up, not measured), every 60 MHz from 900 to 1980.

    Forward time at 1980 MHz 10, 10, 10 and 13 ms (the last stage is heavier), backward twice the forward; a
    quarter of the time does not scale with the clock: t(f) = t0 (0.25 + 0.75 * 1980 / f). Power
    90 + 360 (f / 1980)^2.5 W (backward 5 % more), so it is never power-capped at 700 W and its least energy
    lies at low clocks: a workload unlike the measured one (capped top clocks, flat top times)."""
    rows = ["stage,instruction,frequency,time,energy"]
    for stage, forward_ms in enumerate((10.0, 10.0, 10.0, 13.0)):
        for instruction, time_factor, power_factor in (("forward", 1.0, 1.0), ("backward", 2.0, 1.05)):
            for clock_mhz in range(900, 1981, 60):
                time_s = forward_ms / 1000 * time_factor * (0.25 + 0.75 * 1980 / clock_mhz)
                power_w = (90.0 + 360.0 * (clock_mhz / 1980) ** 2.5) * power_factor
                rows.append(f"{stage},{instruction},{clock_mhz},{time_s:.7f},{power_w * time_s:.6f}")
    return "\n".join(rows) + "\n"


def board_effective_profile(profile: Profile, board_name: str) -> Profile:
    """`profile` as the board runs it at its default power limit: each row's cost at the clock really run."""
    board = load_board(board_name)
    costs = WorkloadCosts(profile, board)
    rows = []
    for m in profile.measurements:
        ran = costs.run_cost(m.stage, m.instruction.value, m.freq_mhz, board.power_limit_default_w).cost
        rows.append(Measurement(m.stage, m.instruction, m.freq_mhz, ran.time_s, ran.energy_j))
    return Profile.from_measurements(rows, source=f"{profile.source} on {board_name}")


def board_true_profile(profile: Profile, board_name: str) -> Profile:
    """The references' profile: every clock of the board, each at the cost the board runs it at its default
    power limit (below the profile's lowest clock, the board's extension of its curves), kept per key as the
    daemon keeps measured options (`pareto_options` against the board's least idle power; the highest clock
    aside). The daemon's sweep goes below the profile's clocks where the energy still pays (light stages
    that wait), so a reference on the profile's clocks alone would not be the best plan the board allows."""
    board = load_board(board_name)
    costs = WorkloadCosts(profile, board)
    least_waiting_w = board.idle_power_w(board.min_clock_mhz)
    rows = []
    for stage, instruction in costs.keys:
        options = [
            _option(
                stage,
                instruction,
                clock_mhz,
                costs.run_cost(stage, instruction, clock_mhz, board.power_limit_default_w).cost,
            )
            for clock_mhz in board.clocks_mhz
        ]
        kept = pareto_options(options, least_waiting_w, top_aside=True)
        rows += [
            Measurement(stage, Instruction(instruction), o.clock_mhz, o.time_s, o.energy_j) for o in kept
        ]
    return Profile.from_measurements(rows, source=f"{profile.source} on {board_name}, every clock")


def _option(stage: int, instruction: str, clock_mhz: int, cost: ComputationCost) -> OptionEstimate:
    return OptionEstimate((stage, instruction), clock_mhz, 1, cost.time_s, cost.energy_j, 0.0, 0.0)


def planner_no_slowdown_pct(profile: Profile, stages: int, microbatches: int, board_name: str) -> float:
    """`perseusctl compare`'s no-slowdown saving (%) for `profile`, at the daemon's unit time."""
    board = load_board(board_name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.csv"
        write_profile(profile, path)
        command = [sys.executable, "-m", "perseusd.ctl.main", "compare", "--profile", str(path)]
        command += ["--stages", str(stages), "--microbatches", str(microbatches), "--json"]
        command += ["--unit-time", str(auto_unit_time_s(profile)), "--factors", "1.05"]
        command += ["--p2p-power", str(board.idle_power_w(board.max_clock_mhz))]
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    found: float = json.loads(out.stdout)["planners"]["perseus_no_slowdown"]["none"]["saving_pct"]
    return round(found, 2)


@functools.cache
def references(name: str) -> dict[str, float]:
    """The planner's no-slowdown saving on the shipped profile and on the board's effective costs, and the
    switch-aware reference (once per case: every seed of it shares them)."""
    board, profile_name, stages, microbatches = case_spec(name)
    if profile_name == SYNTHETIC:
        return {}
    shipped = shipped_profile(profile_name)
    effective = board_effective_profile(shipped, board)
    found = {
        "reference_shipped_pct": planner_no_slowdown_pct(shipped, stages, microbatches, board),
        "reference_board_pct": planner_no_slowdown_pct(effective, stages, microbatches, board),
    }
    aware = [
        switch_aware_pct(p, stages, microbatches, board)
        for p in (effective, board_true_profile(shipped, board))
    ]
    if aware[0] is not None:
        found["reference_switch_aware_pct"] = max(a for a in aware if a is not None)
    return found


def summary(result: dict[str, Any], reference: dict[str, float] | None = None) -> dict[str, Any]:
    """The figures the H100 issue asks for, from the emulator's JSON; with `reference` (`references`), the
    measured saving as a share of each."""
    plan = result.get("plan") or {}
    jobs = [job for job in result.get("daemon_jobs") or [] if job]
    all_max_j = jobs[0].get("all_max_energy_j") if jobs else None
    plan_j = plan.get("plan_energy_j")
    planned = round(100.0 * (1.0 - plan_j / all_max_j), 2) if plan_j and all_max_j else None
    profiling = result.get("profiling") or {}
    measured = result.get("saving_pct")
    figures: dict[str, Any] = {
        "profiling_iterations": profiling.get("iterations"),
        "planned_saving_pct": planned,
        "measured_saving_pct": measured,
        "slowdown_pct": result.get("slowdown_pct"),
        "clock_changes_per_iteration": plan.get("clock_changes_per_iteration"),
        "began_before_clock_fraction": plan.get("wrong_clock_fraction"),
        "began_at_wrong_gpu_clock_fraction": result.get("gpu_wrong_clock_fraction"),
        **_wrong_clock(plan.get("wrong_clock_fraction"), result.get("gpu_wrong_clock_fraction")),
        "prediction_gap_pts": round(abs(planned - measured), 2) if planned is not None and measured else None,
        **_exact(result.get("exact_energy"), measured),
    }
    for name, value in (reference or {}).items():
        figures[name] = value
        share = name.removeprefix("reference_").removesuffix("_pct")
        figures[f"of_{share}_reference"] = round(measured / value, 3) if measured and value > 0 else None
    figures["bars"] = bars(figures)
    return figures


def _exact(exact: dict[str, Any] | None, measured: float | None) -> dict[str, Any]:
    """With `--trace-dir`: the saving by the simulated GPUs' exact energy (`closed_loop_trace.exact_energy`)
    and how far the counters' measurement of the same run is from it (points; not judged by any bar)."""
    if exact is None:
        return {}
    error = round(measured - exact["saving_pct"], 2) if measured is not None else None
    return {"exact_saving_pct": exact["saving_pct"], "measurement_error_pts": error}


def _wrong_clock(daemon: float | None, gpu: float | None) -> dict[str, Any]:
    """The share of computations begun at a wrong clock the bars judge: the simulated GPUs' own clocks at
    each begin where the run was traced (`--trace-dir`), else the daemon's count (which takes a change as
    applied only once its set call has returned, while the board's clock acts within the call: an upper
    bound on the board, 1.5-3x the truth on the H200-layer and uneven workloads)."""
    if gpu is not None:
        return {"wrong_clock_fraction": gpu, "wrong_clock_source": "gpu"}
    return {"wrong_clock_fraction": daemon, "wrong_clock_source": "daemon"}


def bars(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each threshold of `BARS` with this run's value and whether it is met (None: no value to judge)."""
    judged: dict[str, dict[str, Any]] = {}
    for bar, (field, comparison, limit) in BARS.items():
        value = figures.get(field)
        met = None if value is None else (value <= limit if comparison == "<=" else value >= limit)
        judged[bar] = {"value": value, "limit": f"{comparison} {limit:g}", "met": met}
    return judged


def run_case(name: str, args: argparse.Namespace, seed: int | None = None) -> dict[str, Any]:
    board, profile, stages, microbatches = case_spec(name)
    gpus = stages * args.pipelines
    # Counters update every 100 ms of emulated time: a faster world gets faster counters.
    counters = {"PERSEUSD_SIM_UPDATE_PERIOD_S": str(0.1 * args.time_scale)}
    dirs = DaemonDirs.create()
    if profile == SYNTHETIC:
        path = dirs.base / "synthetic-h100.csv"
        path.write_text(synthetic_profile_csv())
        profile = str(path)
    elif profile.startswith(VARIANT):
        path = dirs.base / f"{profile.removeprefix(VARIANT)}-h100.csv"
        path.write_text(variant_csv(profile.removeprefix(VARIANT)))
        profile = str(path)
    elif profile.startswith(FAMILY_PREFIX):
        path = dirs.base / f"{_file_name(profile)}.csv"
        path.write_text(family_csv(profile))
        profile = str(path)
    if seed is not None:
        counters["PERSEUSD_SIM_SEED"] = str(seed)
    daemon = DaemonProcess(dirs, gpus=gpus, extra_args=("--sim-model", board), env=counters)
    started_s, load_before = time.monotonic(), os.getloadavg()[0]
    try:
        daemon.start()  # inside the try: a daemon slow to get ready is stopped, not left running
        command = [
            sys.executable,
            "-m",
            "perseusd.emulate.main",
            "--profile",
            profile,
            "--stages",
            str(stages),
            "--microbatches",
            str(microbatches),
            "--pipelines",
            str(args.pipelines),
            "--iterations",
            str(args.iterations),
            "--time-scale",
            str(args.time_scale),
            "--runtime-dir",
            str(daemon.dirs.runtime_dir),
            "--timeout-s",
            str(args.timeout_s),
            "--json",
        ]
        if args.trace_dir is not None:
            args.trace_dir.mkdir(parents=True, exist_ok=True)
            trace = args.trace_dir / f"{_file_name(_seeded(name, seed))}.jsonl"
            trace.unlink(missing_ok=True)
            command += ["--trace", str(trace)]
        out = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=args.timeout_s + 60
        )
        if out.returncode != 0:
            return {"case": name, "seed": seed, "error": out.stderr.strip()[-2000:]}
        result: dict[str, Any] = json.loads(out.stdout)
        if args.trace_dir is not None:
            path = args.trace_dir / f"{_file_name(_seeded(name, seed))}.profile.csv"
            result["measured_profile"] = export_profile(daemon, result.get("job"), path)
            records = read_trace(trace)
            result["gpu_wrong_clock_fraction"] = _gpu_wrong_clock(records, path.with_suffix(".plan.json"))
            result["exact_energy"] = exact_energy(records)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait()
        if args.trace_dir is not None:  # what the daemon said: which keys were filled, and why not
            log_path = args.trace_dir / f"{_file_name(_seeded(name, seed))}.daemon.log"
            log_path.write_text(daemon.log())
    return {
        "case": name,
        "seed": seed,
        "board": board,
        "stages": stages,
        "microbatches": microbatches,
        "pipelines": args.pipelines,
        "time_scale": args.time_scale,
        "wall_s": round(time.monotonic() - started_s, 1),
        "host": host_load(args.runs_at_once or args.parallel, load_before),
        "summary": summary(result, references(name)),
        **result,
    }


CORES_PER_RUN = 1
"""A run at time scale 1 keeps about one core busy (its stage processes, the emulator, the daemon). With
fewer free, the daemon's event reads and clock sets wait for a core: on a 2-core machine two 8-stage runs at
once measured dense-uneven-rc8x8 at 10.6-10.9 % of computations begun at a wrong clock against 6.1-7.3 %
alone (docs/jobs.md)."""


def host_load(parallel: int, load_before: float) -> dict[str, Any]:
    """The machine a run was measured on: its cores, the runs at once and the 1-minute load average at the
    run's start and end (a run's wrong-clock share and slowdown rise on an overloaded machine)."""
    return {
        "cpus": os.cpu_count(),
        "parallel": parallel,
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def overload_warning(parallel: int, cpus: int | None) -> str | None:
    """A warning when `parallel` runs at once leave them less than `CORES_PER_RUN` each (None: fine)."""
    if cpus is None or parallel == 1 or parallel * CORES_PER_RUN < cpus:
        return None
    return (
        f"warning: --parallel {parallel} on {cpus} cores leaves each run less than {CORES_PER_RUN} core "
        "beside the others: the wrong-clock share and slowdown it measures will be higher than alone"
    )


def _gpu_wrong_clock(records: list[dict[str, Any]], plan_path: Path) -> float | None:
    """`gpu_wrong_clock_fraction` of a run's trace against the plan it ran (None: no plan exported)."""
    if not plan_path.is_file():
        return None
    return gpu_wrong_clock_fraction(records, json.loads(plan_path.read_text()))


def _seeded(case: str, seed: int | None) -> str:
    return case if seed is None else f"{case}-seed{seed}"


def _file_name(case: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", case)


def export_profile(daemon: DaemonProcess, job: Any, path: Path) -> str:
    """The profile the daemon measured for `job`, written to `path` (`perseusctl profile export`), so that a
    run's plans can be replayed offline, and the plan it ran beside it (`perseusctl plan --json`, `path`
    with the suffix `.plan.json`: each computation's planned clock, to tell the trace's wrong-clock begins);
    what the export said (its blocking power, or why there is none)."""
    if not isinstance(job, str):
        return "no job"
    command = [sys.executable, "-m", "perseusd.ctl.main", "--runtime-dir", str(daemon.dirs.runtime_dir)]
    out = subprocess.run(
        [*command, "profile", "export", job, "-o", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    plan = subprocess.run(
        [*command, "plan", job, "--json"], capture_output=True, text=True, check=False, timeout=120
    )
    if plan.returncode == 0:
        path.with_suffix(".plan.json").write_text(plan.stdout)
    return (out.stdout + out.stderr).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--suite",
        choices=("family",),
        help="family: every workload of benchmarks/workload_family.py (cases family:NAME; --cases then "
        "picks among them by NAME, or names drawn-SEED: a workload drawn at random from SEED, not in the "
        "family), judged by the family's bars (benchmarks/closed_loop_suite.py)",
    )
    parser.add_argument(
        "--seeds",
        default="",
        help="comma-separated simulated-GPU seeds (PERSEUSD_SIM_SEED): every case runs once per seed "
        "(default: one run at the daemon's seed 0)",
    )
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--pipelines", type=int, default=1)
    parser.add_argument(
        "--trace-dir",
        type=Path,
        help="keep each case's perseus-emulate trace as DIR/CASE.jsonl (other characters than letters, "
        "digits, '_', '.' and '-' in CASE as '_'; read it with closed_loop_trace.py) and the profile the "
        "daemon measured as DIR/CASE.profile.csv, its log as DIR/CASE.daemon.log",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=3600.0,
        help="per case (profiling A40 or 48 microbatches at time scale 1 takes over 15 min)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="run this many (case, seed) runs at once, each its own invocation of this benchmark (a run "
        "takes about one core at time scale 1: on a machine with cores to spare; default 1)",
    )
    parser.add_argument("--runs-at-once", type=int, help=argparse.SUPPRESS)  # set by --parallel's invocations
    parser.add_argument(
        "--jsonl",
        type=Path,
        help="also append each run's result to this file as one JSON line as soon as the run ends (a suite "
        "stopped part way keeps the runs it finished)",
    )
    args = parser.parse_args()
    if args.suite == "family":
        chosen = args.cases.split(",") if "--cases" in sys.argv else None
        names = family_case(chosen)
    else:
        names = args.cases.split(",")
    for name in names:
        case_spec(name)  # every case checked before the first one runs
    seeds: list[int | None] = [int(s) for s in args.seeds.split(",") if s] or [None]
    signal.signal(signal.SIGTERM, _stop)
    runs = [(name, seed) for name in names for seed in seeds]
    warning = overload_warning(args.parallel, os.cpu_count())
    if warning is not None:
        print(warning, file=sys.stderr)
    if args.parallel > 1:
        results = run_parallel(runs, args)
    else:
        results = [_kept(run_case(name, args, seed), args.jsonl) for name, seed in runs]
    report: dict[str, Any] = {"benchmark": "closed_loop", "results": results}
    if args.suite == "family":
        report["family"] = family_bars(results)
    print(json.dumps(report, indent=2))
    return 0 if all("error" not in r for r in results) else 1


def run_parallel(runs: list[tuple[str, int | None]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each (case, seed) of `runs` as its own invocation of this benchmark, `args.parallel` at a time; the
    results in the order of `runs`. A stop (SIGTERM, Ctrl-C) stops every invocation still running, each of
    which unwinds its own daemon and emulator."""
    pending = list(enumerate(runs))
    running: dict[int, tuple[subprocess.Popen[bytes], IO[bytes]]] = {}
    results: dict[int, dict[str, Any]] = {}
    try:
        while pending or running:
            while pending and len(running) < args.parallel:
                index, (name, seed) = pending.pop(0)
                out = tempfile.TemporaryFile()  # noqa: SIM115 - closed when its run ends
                running[index] = (subprocess.Popen(_one_run_command(name, seed, args), stdout=out), out)
            time.sleep(0.2)
            for index, (process, out) in list(running.items()):
                if process.poll() is not None:
                    result = _one_run_result(out, process.returncode, *runs[index])
                    results[index] = _kept(result, args.jsonl)
                    del running[index]
    finally:
        for process, _out in running.values():
            process.terminate()
        for process, out in running.values():
            process.wait()
            out.close()
    return [results[index] for index in range(len(runs))]


def _one_run_command(name: str, seed: int | None, args: argparse.Namespace) -> list[str]:
    command = [sys.executable, __file__, "--cases", name, "--seeds", "" if seed is None else str(seed)]
    command += ["--time-scale", str(args.time_scale), "--iterations", str(args.iterations)]
    command += ["--pipelines", str(args.pipelines), "--timeout-s", str(args.timeout_s)]
    command += ["--runs-at-once", str(args.parallel)]
    return command + ([] if args.trace_dir is None else ["--trace-dir", str(args.trace_dir)])


def _one_run_result(out: IO[bytes], returncode: int, name: str, seed: int | None) -> dict[str, Any]:
    with out:
        out.seek(0)
        text = out.read()
    try:
        result: dict[str, Any] = json.loads(text)["results"][0]
    except (ValueError, KeyError, IndexError):
        return {"case": name, "seed": seed, "error": f"the run exited {returncode} without a result"}
    return result


def _kept(result: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """`result`, appended to `path` as one JSON line first (None: nowhere)."""
    if path is not None:
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(result) + "\n")
    return result


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM (`timeout`, a killed shell) unwinds like Ctrl-C: the running emulator is killed by its
    `subprocess.run` and the case's daemon stopped by its `finally`, so no child outlives the benchmark."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())

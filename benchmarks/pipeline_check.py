"""One stage of a real pipeline on a real GPU: the pipeline check's runs and report (no torch, no NVML here).

For each position of the real stage in a 4-stage, 8-microbatch 1F1B pipeline (first, middle, last):

1. a fresh `perseusd --backend mixed` with three simulated `h100_sxm` boards beside the real GPU (or, with
   `real="sim"`, a simulated board standing in for it), profiling no lower than the sweep's lowest clock (the
   simulated stages' costs are the real stage's sweep, known down to there);
2. `perseus-emulate --real-stage K` with the pipeline profile of `perseusd.emulate.hybrid` (the real stage's
   own sweep, stage weights 1.0 / 1.25 / 1.0 / 0.9): all-max baseline, online profiling, the default
   `no_slowdown` plan, measured; then a second all-max baseline (`--baseline-only`), the two averaged;
3. while both run, the real GPU's SM clock (and whether the power cap holds it) polled every ~1 ms, to tell
   which of the real stage's computations began at a clock other than the plan's (measured on the GPU, not
   taken from the plan);
4. the report: the pipeline's iteration time against all-max, the real stage's energy per iteration
   against all-max, the planner's predicted saving for that stage (the daemon's profile and deployed plan),
   profiling iterations, the wrong-clock share, and the issue's bars.

`benchmarks/gpu_validate.py --pipeline` runs it on a GPU machine with the real stage's sweep measured there;
`python benchmarks/pipeline_check.py --stand-in` runs it here with a recorded sweep (the H200's, in
docs/gpu-validate/) and a simulated board in the real GPU's place.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_truth import stopped_at_exit
from perseusd.emulate.hybrid import DEFAULT_WEIGHTS, SweepRow, critical_stage, pipeline_profile
from perseusd.emulate.real_stage import RealStageSpec
from perseusd.emulate.trace import read_trace
from perseusd.planner.dag import Instruction, from_stage_orders
from perseusd.planner.evaluate import measurements_for, stage_energies_j
from perseusd.planner.profile_csv import profile_to_csv, read_profile_stream

REPO = Path(__file__).resolve().parents[1]
RECORDED_SWEEP = REPO / "docs" / "gpu-validate" / "h200-2026-11-25.json"
STAGES = 4
MICROBATCHES = 8
POSITIONS = (0, 1, 3)
"""First and last: off the critical path; 1: the heaviest stage (DEFAULT_WEIGHTS), the critical one."""
CLOCK_TOLERANCE_MHZ = 15
"""A clock reading within one step of the planned clock is the planned clock."""
MEASURED_TOLERANCE = 0.05
"""A clock measured on the GPU (cycles over its global timer) within this fraction of the planned clock is
the planned clock (the probe reads to ~2.5 %; plans' clocks lie 12 % or more apart)."""
CAPPED_FLOOR = 0.85
"""Below a planned top clock, a measured clock down to this fraction of it is the power cap's, not wrong."""
DAEMON_READY_S = 30.0
BARS = {
    "off_critical_share_of_predicted": 0.8,
    "slowdown_pct": 1.0,
    "profiling_iterations": 80,
    "wrong_clock_pct": 15.0,
}

ClockReader = Callable[[], tuple[int, bool]]
"""The real GPU's SM clock now (MHz) and whether the power cap holds it below the locked clock."""


@dataclass(frozen=True)
class CheckSettings:
    real: str = "nvml"
    """What plays the real GPU: "nvml" or "sim" (a simulated stand-in)."""
    iterations: int = 10
    max_profiling_iterations: int = 150
    timeout_s: float = 420.0
    stage: RealStageSpec = field(default_factory=RealStageSpec)
    """The real stage's layers, width and sequence (the emulator picks its device)."""
    weights: tuple[float, ...] = DEFAULT_WEIGHTS
    work_dir: Path | None = None
    keep: Path | None = None
    """Keep each position's emulator JSON, trace and daemon log here."""
    seed: int = 0
    """The simulated boards' seed (counter noise, lock latencies)."""


@dataclass
class ClockPoller:
    """Polls `read` every ~1 ms in a thread; `samples` are (monotonic s, clock MHz, capped)."""

    read: ClockReader
    samples: list[tuple[float, int, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @contextlib.contextmanager
    def running(self) -> Iterator[ClockPoller]:
        thread = threading.Thread(target=self._poll, name="pipeline-check-clocks", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=5.0)

    def _poll(self) -> None:
        while not self._stop.is_set():
            clock_mhz, capped = self.read()
            now_s = time.monotonic()
            if not self.samples or self.samples[-1][1:] != (clock_mhz, capped):
                self.samples.append((now_s, clock_mhz, capped))
            time.sleep(0.001)


# ---------------------------------------------------------------- analysis (pure)


def planned_clocks(plan: Mapping[str, Any], stage: int) -> dict[tuple[str, int], int]:
    """The deployed plan's clock for each (instruction, microbatch) of `stage` (a `perseus-plan` document)."""
    return {(c["instruction"], int(c["microbatch"])): int(c["freq_mhz"]) for c in plan["stages"][stage]}


def clock_at(samples: Sequence[tuple[float, int, bool]], time_s: float) -> tuple[int, bool] | None:
    """The last clock sample at or before `time_s` (None before the first)."""
    index = bisect.bisect_right([s[0] for s in samples], time_s) - 1
    return None if index < 0 else (samples[index][1], samples[index][2])


def began_wrong(planned_mhz: int, reading: tuple[int, bool]) -> bool:
    """A computation began at a wrong clock: the GPU's clock was not the planned one (one step of tolerance),
    unless the power cap held it below a higher planned clock (the GPU runs what its limit allows)."""
    clock_mhz, capped = reading
    if abs(clock_mhz - planned_mhz) <= CLOCK_TOLERANCE_MHZ:
        return False
    return not (capped and clock_mhz < planned_mhz)


def measured_wrong(planned_mhz: int, measured_mhz: int, top_mhz: int) -> bool:
    """A computation began at a wrong clock by the clock measured at its start (on the GPU, or the one a
    simulated GPU ran it at): more than `MEASURED_TOLERANCE` off the planned clock, unless the plan asked for
    the top clock and the power cap held the GPU a little below it."""
    if abs(measured_mhz - planned_mhz) <= MEASURED_TOLERANCE * planned_mhz:
        return False
    capped_top = planned_mhz >= top_mhz - CLOCK_TOLERANCE_MHZ and measured_mhz >= CAPPED_FLOOR * planned_mhz
    return not (capped_top and measured_mhz < planned_mhz)


def wrong_clock_share(
    computations: Sequence[Mapping[str, Any]],
    plan: Mapping[str, Any],
    stage: int,
    samples: Sequence[tuple[float, int, bool]],
    window: tuple[int, int],
) -> tuple[float | None, int, str]:
    """The share of the real stage's computations in the measured window (iterations [first, last)) that
    began at a wrong clock by the GPU's own readings, how many were judged, and which readings: the clock
    each computation's record carries ("gpu": measured at its start on the GPU, or a simulated GPU's), else
    the polled ones ("polled": NVML's reported clock, which lags the real one by ~100 ms)."""
    clocks = planned_clocks(plan, stage)
    top_mhz = max(int(c["freq_mhz"]) for row in plan["stages"] for c in row)
    judged = wrong = 0
    sources = set()
    for record in computations:
        if record["stage"] != stage or not window[0] <= record["iteration"] < window[1]:
            continue
        planned = clocks.get((record["instruction"], int(record["microbatch"])))
        if planned is None:
            continue
        if record.get("clock_mhz", 0) > 0:
            sources.add("gpu")
            judged += 1
            wrong += measured_wrong(planned, int(record["clock_mhz"]), top_mhz)
            continue
        reading = clock_at(samples, record["start_s"])
        if reading is not None:
            sources.add("polled")
            judged += 1
            wrong += began_wrong(planned, reading)
    return (wrong / judged if judged else None), judged, "+".join(sorted(sources))


def predicted_stage_saving_pct(
    profile_csv: str, p_block_w: float, plan: Mapping[str, Any], stage: int, all_max_time_s: float
) -> float:
    """The planner's predicted saving for one stage: its energy under the deployed plan (at the plan's
    iteration time) against all-max clocks (at the all-max time), both from the daemon's profile."""
    profile = read_profile_stream(io.StringIO(profile_csv), "the daemon's profile")
    orders = [
        [(Instruction(c["instruction"]), c["microbatch"], c["chunk"]) for c in row] for row in plan["stages"]
    ]
    dag = from_stage_orders(orders, MICROBATCHES, 1, "1f1b")
    planned = [c["freq_mhz"] for row in plan["stages"] for c in row]
    top = [
        profile.max_freq_mhz(dag.virtual_stage(n), dag.computations[n].instruction)
        for n in range(len(planned))
    ]
    time_s = float(plan.get("refined_time_s") or plan["time_s"])
    planned_j = stage_energies_j(dag, measurements_for(dag, profile, planned), p_block_w, time_s)[stage]
    all_max_j = stage_energies_j(dag, measurements_for(dag, profile, top), p_block_w, all_max_time_s)[stage]
    return 100.0 * (1.0 - planned_j / all_max_j)


def average_baseline(first: Mapping[str, Any], second: Mapping[str, Any] | None) -> dict[str, float]:
    """All-max before and after the closed loop, averaged (a GPU's energy drifts by minutes)."""
    runs = [first, *([second] if second else [])]
    return {key: sum(float(r[key]) for r in runs) / len(runs) for key in ("time_s", "energy_j")}


def position_report(
    position: int,
    closed: Mapping[str, Any],
    after: Mapping[str, Any] | None,
    analysis: Mapping[str, Any],
    weights: Sequence[float],
) -> dict[str, Any]:
    """One position's figures and bars from the two emulator reports and the analysis."""
    real = closed["real_stage"]
    baseline = average_baseline(
        {
            "time_s": closed["baseline"]["iteration_time_s"],
            "energy_j": real["baseline_energy_per_iteration_j"],
        },
        None
        if after is None
        else {
            "time_s": after["baseline"]["iteration_time_s"],
            "energy_j": after["real_stage"]["baseline_energy_per_iteration_j"],
        },
    )
    optimized_s = closed["optimized"]["iteration_time_s"]
    optimized_j = real["optimized_energy_per_iteration_j"]
    measured_pct = 100.0 * (1.0 - optimized_j / baseline["energy_j"])
    slowdown_pct = 100.0 * (optimized_s / baseline["time_s"] - 1.0)
    critical = position == critical_stage(weights)
    predicted = analysis.get("predicted_stage_saving_pct")
    wrong = analysis.get("wrong_clock_share")
    figures = {
        "position": position,
        "critical": critical,
        "all_max_time_s": round(baseline["time_s"], 5),
        "time_s": round(optimized_s, 5),
        "slowdown_pct": round(slowdown_pct, 2),
        "real_all_max_energy_j": round(baseline["energy_j"], 3),
        "real_energy_j": round(optimized_j, 3),
        "real_saving_pct": round(measured_pct, 2),
        "predicted_stage_saving_pct": None if predicted is None else round(predicted, 2),
        "pipeline_saving_pct": closed["saving_pct"],
        "profiling_iterations": (closed.get("profiling") or {}).get("daemon_iterations"),
        "wrong_clock_pct": None if wrong is None else round(100.0 * wrong, 2),
        "wrong_clock_judged": analysis.get("wrong_clock_judged"),
        "wrong_clock_source": analysis.get("wrong_clock_source"),
        "daemon_wrong_clock_pct": _pct((closed.get("plan") or {}).get("wrong_clock_fraction")),
        "plan_note": analysis.get("plan_note", ""),
        "real_executor": analysis.get("executor"),
    }
    return {**figures, "bars": bars(figures)}


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(100.0 * fraction, 2)


def bars(figures: Mapping[str, Any]) -> dict[str, bool | None]:
    """The issue's bars for one position (None: not measured)."""

    def at_most(value: Any, limit: float) -> bool | None:
        return None if value is None else bool(value <= limit)

    result: dict[str, bool | None] = {
        "slowdown": at_most(figures["slowdown_pct"], BARS["slowdown_pct"]),
        "profiling": at_most(figures["profiling_iterations"], BARS["profiling_iterations"]),
        "wrong_clock": at_most(figures["wrong_clock_pct"], BARS["wrong_clock_pct"]),
    }
    if figures["critical"]:
        result["no_more_than_all_max"] = bool(figures["real_energy_j"] <= figures["real_all_max_energy_j"])
    else:
        predicted = figures["predicted_stage_saving_pct"]
        result["share_of_predicted"] = (
            None
            if not predicted or predicted <= 0
            else bool(figures["real_saving_pct"] >= BARS["off_critical_share_of_predicted"] * predicted)
        )
    return result


# ---------------------------------------------------------------- runs


def _env() -> dict[str, str]:
    paths = [str(REPO), str(REPO / "client_lib"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


@contextlib.contextmanager
def mixed_daemon(
    base: Path, real: str, min_clock_mhz: int, seed: int = 0, sim_gpus: int = STAGES - 1
) -> Iterator[Path]:
    """`perseusd --backend mixed` (`sim_gpus` h100_sxm boards beside the real GPU) in `base`: its run dir."""
    runtime_dir = base / "run"
    command = [sys.executable, "-m", "perseusd.daemon.main", "--backend", "mixed", "--mixed-real", real]
    command += ["--sim-gpus", str(sim_gpus), "--sim-model", "h100_sxm", "--log-level", "INFO"]
    command += ["--runtime-dir", str(runtime_dir), "--state-dir", str(base / "state")]
    env = {**_env(), "PERSEUSD_PROFILE_MIN_CLOCK_MHZ": str(min_clock_mhz), "PERSEUSD_SIM_SEED": str(seed)}
    with (base / "daemon.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    with stopped_at_exit(process, 30.0):
        deadline_s = time.monotonic() + DAEMON_READY_S
        while not (runtime_dir / "control.sock").exists():
            if process.poll() is not None or time.monotonic() > deadline_s:
                raise RuntimeError(f"perseusd did not start: {(base / 'daemon.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield runtime_dir


def emulate(
    runtime_dir: Path, profile: Path, position: int, settings: CheckSettings, job: str, *extra: str
) -> dict[str, Any]:
    """One `perseus-emulate --real-stage` run; its JSON report."""
    out = runtime_dir.parent / f"{job}.json"
    command = [sys.executable, "-m", "perseusd.emulate.main", "--profile", str(profile)]
    command += ["--stages", str(STAGES), "--microbatches", str(MICROBATCHES), "--real-stage", str(position)]
    command += ["--real-layers", str(settings.stage.layers), "--real-d-model", str(settings.stage.d_model)]
    command += ["--real-seq", str(settings.stage.seq), "--iterations", str(settings.iterations)]
    command += ["--max-profiling-iterations", str(settings.max_profiling_iterations), "--job", job]
    command += ["--runtime-dir", str(runtime_dir), "--timeout-s", str(settings.timeout_s)]
    command += ["--json-file", str(out), *extra]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=_env(), timeout=settings.timeout_s + 60
    )
    if not out.exists():
        raise RuntimeError(f"perseus-emulate failed ({done.returncode}): {done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(out.read_text())
    if done.returncode != 0:
        report["stderr_tail"] = done.stderr[-3000:]
    return report


def _daemon_view(runtime_dir: Path, job: str) -> dict[str, Any]:
    """The daemon's profile (CSV, blocking power), deployed plan and plan note for `job`."""
    from perseus_client.client import PerseusClient

    with PerseusClient(runtime_dir, job, timeout_s=10.0, strict=True) as client:
        profile = client.profile_export(job)
        info = next((j for j in client.jobs().jobs if j.job == job), None)
        return {
            "profile_csv": profile.csv,
            "p_block_w": profile.p_block_w,
            "plan": client.plan(job),
            "plan_note": "" if info is None else info.plan_note,
        }


def run_position(
    position: int,
    sweep: Sequence[SweepRow],
    settings: CheckSettings,
    make_reader: Callable[[Path, str], ClockReader],
) -> dict[str, Any]:
    """The closed loop and the second all-max with the real stage at `position`, and its report."""
    base = Path(tempfile.mkdtemp(prefix=f"pipeline-check-{position}-", dir=settings.work_dir))
    base.chmod(0o755)
    profile = base / "pipeline.csv"
    profile.write_text(profile_to_csv(pipeline_profile(sweep, position, settings.weights)))
    job = f"pipeline-check-{position}"
    trace = base / "trace.jsonl"
    with mixed_daemon(base, settings.real, min(r.clock_mhz for r in sweep), settings.seed) as runtime_dir:
        poller = ClockPoller(make_reader(runtime_dir, _first_gpu(runtime_dir)))
        with poller.running():
            closed = emulate(runtime_dir, profile, position, settings, job, "--trace", str(trace))
            after = emulate(runtime_dir, profile, position, settings, f"{job}-after", "--baseline-only")
        view = _daemon_view(runtime_dir, job) if closed.get("optimized") else {}
    analysis = _analyse(position, closed, view, poller.samples, read_trace(trace) if trace.exists() else [])
    if settings.keep is not None:
        _keep(settings.keep, position, base, closed, after, view)
        (settings.keep / f"position{position}-clocks.json").write_text(json.dumps(poller.samples))
        with contextlib.suppress(OSError):
            (settings.keep / f"position{position}-trace.jsonl").write_text(trace.read_text())
    if closed.get("failure") or not closed.get("optimized"):
        return {
            "position": position,
            "error": closed.get("failure") or "no optimized window",
            "report": closed,
        }
    return position_report(
        position, closed, after if after.get("baseline") else None, analysis, settings.weights
    )


def _first_gpu(runtime_dir: Path) -> str:
    from perseus_client.client import PerseusClient

    with PerseusClient(runtime_dir, "pipeline-check", timeout_s=10.0, strict=True) as client:
        return client.status().gpus[0].uuid


def _analyse(
    position: int,
    closed: Mapping[str, Any],
    view: Mapping[str, Any],
    samples: Sequence[tuple[float, int, bool]],
    trace: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    executor = next((r for r in trace if r.get("kind") == "executor"), None)
    described = {"executor": {k: v for k, v in executor.items() if k != "kind"}} if executor else {}
    if not view:
        return described
    windows = [r for r in trace if r.get("kind") == "window" and r.get("phase") == "optimized"]
    computations = [r for r in trace if r.get("kind") == "computation" and r.get("pipeline") == 0]
    share, judged, source = (None, 0, "")
    if windows:
        window = (int(windows[-1]["first"]), int(windows[-1]["last"]))
        share, judged, source = wrong_clock_share(computations, view["plan"], position, samples, window)
    all_max_s = float((closed.get("plan") or {}).get("fastest_time_s") or 0.0)
    jobs = [j for j in closed.get("daemon_jobs") or [] if j]
    if jobs and jobs[0].get("all_max_time_s"):
        all_max_s = float(jobs[0]["all_max_time_s"])
    predicted = predicted_stage_saving_pct(
        view["profile_csv"], view["p_block_w"], view["plan"], position, all_max_s
    )
    return {
        "wrong_clock_share": share,
        "wrong_clock_judged": judged,
        "wrong_clock_source": source,
        "predicted_stage_saving_pct": predicted,
        "plan_note": view.get("plan_note", ""),
        **described,
    }


def _keep(keep: Path, position: int, base: Path, *documents: Any) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    names = ("closed", "after", "daemon")
    for name, document in zip(names, documents, strict=True):
        (keep / f"position{position}-{name}.json").write_text(json.dumps(document, indent=1))
    with contextlib.suppress(OSError):
        (keep / f"position{position}-daemon.log").write_text((base / "daemon.log").read_text())


def run_check(
    sweep: Sequence[SweepRow],
    settings: CheckSettings,
    make_reader: Callable[[Path, str], ClockReader],
    positions: Sequence[int] = POSITIONS,
    on_position: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every position, one after the other; `on_position` sees each result as it comes (partial reports)."""
    started_s = time.monotonic()
    results = []
    for position in positions:
        try:
            result = run_position(position, sweep, settings, make_reader)
        except Exception as exc:  # one position's failure is reported; the others still run
            result = {"position": position, "error": f"{type(exc).__name__}: {exc}"}
        results.append(result)
        if on_position is not None:
            on_position(result)
    return {
        "stages": STAGES,
        "microbatches": MICROBATCHES,
        "weights": list(settings.weights),
        "real": settings.real,
        "positions": results,
        "wall_s": round(time.monotonic() - started_s, 1),
        "ok": all("error" not in r for r in results),
    }


def stand_in_reader(runtime_dir: Path, uuid: str) -> ClockReader:
    """The stand-in board's clock as the daemon set it (its control file), never capped."""
    from perseusd.gpu.sim_boards import load_board
    from perseusd.gpu.sim_shared import StateMap, state_path

    state = StateMap(state_path(runtime_dir / "sim", uuid), writable=False)
    top_mhz = load_board(state.header.model).max_clock_mhz

    def read() -> tuple[int, bool]:
        locked = state.read_control().locked_sm_clock_mhz
        return (top_mhz if locked is None else locked), False

    return read


def recorded_sweep(path: Path = RECORDED_SWEEP) -> list[SweepRow]:
    """The job's own locked-clock sweep of a `gpu_validate` report."""
    return [SweepRow.from_json(row) for row in json.loads(path.read_text())["sweep"]]


def markdown(report: Mapping[str, Any]) -> str:
    """The positions as the table docs/gpu-backends.md keeps."""
    lines = [
        "| real stage | critical | slowdown | real stage energy vs all-max | planner's prediction for it | "
        "profiling iterations | begun at a wrong clock (GPU readings) | bars |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report.get("positions", []):
        if "error" in row:
            lines.append(f"| {row['position']} | | failed: {row['error'][:80]} | | | | | |")
            continue
        met = ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in row["bars"].items() if v is not None)
        lines.append(
            f"| {row['position']} | {'yes' if row['critical'] else 'no'} | {row['slowdown_pct']:+.2f} % | "
            f"{-row['real_saving_pct']:+.2f} % ({row['real_energy_j']:.1f} vs "
            f"{row['real_all_max_energy_j']:.1f} J) | "
            f"{_fmt_pct(row['predicted_stage_saving_pct'])} saving | {row['profiling_iterations']} | "
            f"{_fmt_pct(row['wrong_clock_pct'])} | {met} |"
        )
    return "\n".join(lines) + "\n"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} %"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stand-in", action="store_true", help="a simulated board plays the real GPU")
    parser.add_argument("--sweep", type=Path, default=RECORDED_SWEEP, help="a gpu_validate report's sweep")
    parser.add_argument("--positions", default=",".join(map(str, POSITIONS)))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--keep", type=Path, help="keep each position's reports and daemon log here")
    parser.add_argument("--seeds", default="0", help="run every position once per seed (comma-separated)")
    args = parser.parse_args(argv)
    if not args.stand_in:
        parser.error(
            "without a GPU only --stand-in runs here; on a GPU: benchmarks/gpu_validate.py --pipeline"
        )
    positions = [int(p) for p in args.positions.split(",")]
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        settings = CheckSettings(real="sim", iterations=args.iterations, keep=args.keep, seed=seed)
        runs.append(
            {"seed": seed, **run_check(recorded_sweep(args.sweep), settings, stand_in_reader, positions)}
        )
    load = os.getloadavg()
    print(json.dumps({"benchmark": "pipeline_check", "load_avg": load, "runs": runs}, indent=2))
    return 0 if all(run["ok"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The emulator's output: a header, one line per iteration, a summary; or one JSON object (`--json`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from perseusd.emulate.preflight import JobLayout
from perseusd.emulate.results import IterationRow, PhaseResult, PipelinePhase, RunResult
from perseusd.emulate.straggler import StragglerSpec

PLACEHOLDER = "-"


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """The run's inputs as the report shows them."""

    job: str
    layout: JobLayout
    register_schedule: str
    time_scale: float
    straggler: StragglerSpec | None = None
    dp_sync: bool = True


def header(run: RunDescription) -> str:
    layout, shape = run.layout, run.layout.shape
    chunks = f", {shape.num_chunks} chunks per GPU" if shape.num_chunks > 1 else ""
    daemons = f" of {len(layout.runtime_dirs)} daemons" if len(layout.runtime_dirs) > 1 else ""
    if layout.spans:
        daemons += " (each pipeline's stages spread over them)"
    if layout.tensor_parallel > 1:
        daemons += f", {layout.tensor_parallel} GPUs per stage"
    prediction = layout.all_max
    lines = [
        f"perseus-emulate: job {run.job}: {layout.num_pipelines} pipeline(s) x {shape.num_stages} stages "
        f"({run.register_schedule}, {shape.num_microbatches} microbatches{chunks}) on "
        f"{len(layout.all_gpus)} simulated {layout.board.name} GPUs{daemons}, time scale {run.time_scale:g}",
        f"  profile {layout.profile_source}; all-max by the profile: {prediction.iteration_time_s:.4f} s, "
        f"{prediction.energy_per_iteration_j:.1f} J per iteration",
    ]
    if run.straggler is not None:
        lines.append(f"  straggler: {_straggler_text(run.straggler)}")
    if layout.num_pipelines > 1 and not run.dp_sync:
        lines.append("  no data-parallel sync: pipelines do not wait for each other")
    lines.append(f"{'iter':>5}  {'phase':<12} {'time (s)':>9} {'energy (J)':>11}")
    return "\n".join(lines)


def _straggler_text(straggler: StragglerSpec) -> str:
    to = "the end" if straggler.to_iterations is None else f"{straggler.to_iterations}"
    return (
        f"pipeline {straggler.pipeline} x{straggler.factor:g} in the baseline and from "
        f"{straggler.from_iterations} to {to} iterations after the job runs"
    )


def row_line(row: IterationRow) -> str:
    return f"{row.iteration:>5}  {row.phase:<12} {row.time_s:>9.4f} {row.energy_j:>11.1f}"


def _fmt(value: float | None, digits: int, unit: str = "") -> str:
    return PLACEHOLDER if value is None else f"{value:.{digits}f}{unit}"


def _phase_line(name: str, phase: PhaseResult | None) -> str:
    if phase is None:
        return f"{name:<10} {'not measured':>14}"
    return (
        f"{name:<10} {phase.iteration_time_s:>12.4f} s {phase.energy_per_iteration_j:>12.1f} J "
        f"{phase.power_w:>9.1f} W  ({phase.iterations} iterations)"
    )


def _pipeline_cell(phase: PhaseResult | None, pipeline: int) -> str:
    if phase is None or not phase.pipelines:
        return f"{PLACEHOLDER:>22}"
    own = phase.pipelines[pipeline]
    return f"{own.iteration_time_s:>9.4f} s {own.energy_per_iteration_j:>9.1f} J"


def _pipeline_lines(run: RunDescription, result: RunResult) -> list[str]:
    layout = run.layout
    if layout.num_pipelines == 1:
        return []
    lines = [f"{'pipeline':<10} {'daemon':>6} {'baseline':>22} {'optimized':>22}"]
    for p in range(layout.num_pipelines):
        mark = "  straggler" if run.straggler is not None and run.straggler.pipeline == p else ""
        lines.append(
            f"{p:<10} {layout.daemons[p]:>6} {_pipeline_cell(result.baseline, p)} "
            f"{_pipeline_cell(result.optimized, p)}{mark}"
        )
    return lines


def summary(run: RunDescription, result: RunResult) -> str:
    lines = [
        "== result",
        f"{'':<10} {'time/iteration':>14} {'energy/iteration':>16} {'power':>11}",
        _phase_line("baseline", result.baseline),
        _phase_line("optimized", result.optimized),
        *_pipeline_lines(run, result),
    ]
    if result.optimized is not None:
        lines.append(
            f"energy saving {_fmt(result.saving_pct, 1, ' %')}, slowdown {_fmt(result.slowdown_pct, 2, ' %')}"
        )
        profiling, solving = result.phase_totals("profiling"), result.phase_totals("solving")
        lines.append(
            f"profiling: {profiling[0]} iterations, {profiling[1]:.1f} J; "
            f"solving: {solving[0]} iterations, {solving[1]:.1f} J" + (" (cached)" if result.cached else "")
        )
    job = result.job
    if job is not None:
        changes = _fmt(job.clock_changes_per_iteration, 1)
        wrong = _fmt(None if job.wrong_clock_fraction is None else 100 * job.wrong_clock_fraction, 2, " %")
        lines.append(
            f"plan: point {_fmt(job.plan_index, 0)} of {job.frontier_points}, "
            f"{_fmt(job.plan_time_s, 4, ' s')} planned (policy {job.policy}), "
            f"{changes} clock changes/iteration, {wrong} of computations began at a wrong clock"
        )
    return "\n".join(lines)


def _phase_json(phase: PhaseResult | None) -> dict[str, Any] | None:
    if phase is None:
        return None
    data = dataclasses.asdict(phase)
    del data["pipelines"]  # per pipeline under the top-level "pipelines"
    data["pipeline_iteration_times_s"] = list(phase.pipeline_iteration_times_s)
    return data


def _pipeline_phase_json(phase: PhaseResult | None, pipeline: int) -> dict[str, Any] | None:
    own: PipelinePhase | None = phase.pipelines[pipeline] if phase is not None and phase.pipelines else None
    return None if own is None else dataclasses.asdict(own)


def _pipelines_json(run: RunDescription, result: RunResult) -> list[dict[str, Any]]:
    return [
        {
            "pipeline": p,
            "daemon": run.layout.daemons[p],
            "stage_daemons": list(run.layout.stage_daemons[p]),
            "gpus": list(run.layout.gpus[p]),
            "baseline": _pipeline_phase_json(result.baseline, p),
            "optimized": _pipeline_phase_json(result.optimized, p),
        }
        for p in range(run.layout.num_pipelines)
    ]


def _straggler_json(straggler: StragglerSpec | None) -> dict[str, Any] | None:
    if straggler is None:
        return None
    return {
        "pipeline": straggler.pipeline,
        "factor": straggler.factor,
        "from": straggler.from_iterations,
        "to": straggler.to_iterations,
    }


def to_json(run: RunDescription, result: RunResult) -> dict[str, Any]:
    """The `--json` object: inputs, both phases, saving and slowdown, profiling and plan statistics."""
    layout, shape, job = run.layout, run.layout.shape, result.job
    closed_loop = result.optimized is not None or job is not None
    profiling_n, profiling_j = result.phase_totals("profiling")
    solving_n, solving_j = result.phase_totals("solving")
    return {
        "job": run.job,
        "profile": layout.profile_source,
        "model": layout.board.name,
        "board": layout.board.name,
        "schedule": run.register_schedule,
        "stages": shape.num_stages,
        "microbatches": shape.num_microbatches,
        "chunks": shape.num_chunks,
        "num_pipelines": layout.num_pipelines,
        "tensor_parallel": layout.tensor_parallel,
        "time_scale": run.time_scale,
        "runtime_dirs": [str(path) for path in layout.runtime_dirs],
        "dp_sync": run.dp_sync,
        "straggler": _straggler_json(run.straggler),
        "gpus": [list(pipeline) for pipeline in layout.gpus],
        "pipelines": _pipelines_json(run, result),
        "model_all_max": dataclasses.asdict(layout.all_max),
        "baseline": _phase_json(result.baseline),
        "optimized": _phase_json(result.optimized),
        "saving_pct": result.saving_pct,
        "slowdown_pct": result.slowdown_pct,
        "profiling": {
            "iterations": profiling_n,
            "energy_j": profiling_j,
            "daemon_iterations": job.profiling.iterations if job and job.profiling else None,
            "daemon_energy_j": job.profiling.energy_j if job and job.profiling else None,
        }
        if closed_loop
        else None,
        "solving": {"iterations": solving_n, "energy_j": solving_j} if closed_loop else None,
        "cached": result.cached,
        "running_iteration": result.running_iteration,
        "plan": _plan_json(result),
        "real_stage": _real_stage_json(run, result),
        "daemon_jobs": [None if job is None else dataclasses.asdict(job) for job in result.daemon_jobs],
        "iterations": [dataclasses.asdict(row) for row in result.rows],
        "failure": result.failure,
    }


def _plan_json(result: RunResult) -> dict[str, Any] | None:
    job = result.job
    if job is None:
        return None
    return {
        "state": job.state,
        "policy": job.policy,
        "target": job.target,
        "frontier_points": job.frontier_points,
        "plan_index": job.plan_index,
        "plan_time_s": job.plan_time_s,
        "plan_energy_j": job.plan_energy_j,
        "fastest_time_s": job.fastest_time_s,
        "clock_changes_per_iteration": job.clock_changes_per_iteration,
        "wrong_clock_fraction": job.wrong_clock_fraction,
    }


def _real_stage_json(run: RunDescription, result: RunResult) -> dict[str, Any] | None:
    """The real stage (`--real-stage`): its GPU, and its own energy per iteration in each phase."""
    layout = run.layout
    if layout.real_stage is None:
        return None
    key = layout.counter_keys[0][layout.real_stage]
    baseline = None if result.baseline is None else result.baseline.gpu_energy_per_iteration_j.get(key)
    optimized = None if result.optimized is None else result.optimized.gpu_energy_per_iteration_j.get(key)
    saving = None if baseline is None or optimized is None else 100.0 * (1.0 - optimized / baseline)
    return {
        "stage": layout.real_stage,
        "gpu": layout.real_gpu,
        "simulated_stand_in": layout.real_simulated,
        "baseline_energy_per_iteration_j": baseline,
        "optimized_energy_per_iteration_j": optimized,
        "saving_pct": saving,
    }

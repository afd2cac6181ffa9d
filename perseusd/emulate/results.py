"""What a run measured: per-iteration rows and per-phase results, computed from counter samples and the
iteration starts the pipelines' first stages reported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perseus_client.protocol import JobInfo

from perseusd.emulate.measure import CounterSample, window


@dataclass(frozen=True)
class IterationRow:
    """One iteration of pipeline 0: its phase, time (start to next start) and the job's energy in it.

    When the coordinator could not sample every iteration start (iterations shorter than the counter's
    period), the energy between two samples is shared evenly by the iterations between them.
    """

    iteration: int
    phase: str
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class PipelinePhase:
    """One pipeline in a measured phase: its first stage's mean iteration time and its GPUs' energy."""

    iteration_time_s: float
    energy_per_iteration_j: float
    """Its GPUs' average power over the window times its iteration time."""
    power_w: float
    energy_j: float


@dataclass(frozen=True)
class PhaseResult:
    """A measured phase: `iterations` iterations, all pipelines, all GPUs of the job."""

    iterations: int
    iteration_time_s: float
    """Mean over pipelines of each pipeline's mean time from iteration start to iteration start."""
    energy_per_iteration_j: float
    """The GPUs' average power over the window times the iteration time."""
    power_w: float
    energy_j: float
    """Counter energy between the window's two samples."""
    duration_s: float
    pipeline_iteration_times_s: tuple[float, ...]
    pipelines: tuple[PipelinePhase, ...] = ()
    gpu_energy_per_iteration_j: dict[str, float] = field(default_factory=dict)
    """Each GPU's (counter key's) average power over the window times its pipeline's iteration time: one
    stage's energy per iteration."""


@dataclass
class RunResult:
    """Everything the report shows; phases missing when the run stopped before measuring them."""

    rows: list[IterationRow] = field(default_factory=list)
    baseline: PhaseResult | None = None
    optimized: PhaseResult | None = None
    job: JobInfo | None = None
    """The first daemon's view of the job, with the state combined over all daemons."""
    daemon_jobs: list[JobInfo | None] = field(default_factory=list)
    """Each daemon's view of the job at the last sampled iteration (None: it did not know the job)."""
    cached: bool = False
    running_iteration: int | None = None
    """Pipeline 0's first sampled iteration with the job running on every daemon."""
    failure: str | None = None

    def phase_totals(self, phase: str) -> tuple[int, float]:
        """(iterations, energy in J) of the rows of one phase (e.g. "profiling")."""
        rows = [row for row in self.rows if row.phase == phase]
        return len(rows), sum(row.energy_j for row in rows)

    @property
    def saving_pct(self) -> float | None:
        if self.baseline is None or self.optimized is None:
            return None
        return 100.0 * (1.0 - self.optimized.energy_per_iteration_j / self.baseline.energy_per_iteration_j)

    @property
    def slowdown_pct(self) -> float | None:
        if self.baseline is None or self.optimized is None:
            return None
        return 100.0 * (self.optimized.iteration_time_s / self.baseline.iteration_time_s - 1.0)


def phase_result(
    span: tuple[int, int],
    samples: Mapping[int, CounterSample],
    starts: Sequence[Mapping[int, float]],
    counter_keys: Sequence[Sequence[str]],
) -> PhaseResult:
    """The phase measured from the sample at iteration `span[0]` to the one at `span[1]`.

    `starts[p][k]` is when pipeline p began iteration k; `counter_keys[p]` are pipeline p's GPUs.
    """
    first, last = span
    count = last - first
    energy = window(samples[first], samples[last])
    times_s = tuple((pipeline[last] - pipeline[first]) / count for pipeline in starts)
    iteration_time_s = sum(times_s) / len(times_s)
    pipelines = []
    per_gpu: dict[str, float] = {}
    for time_s, gpus in zip(times_s, counter_keys, strict=True):
        own = window(samples[first], samples[last], gpus)
        pipelines.append(PipelinePhase(time_s, own.power_w * time_s, own.power_w, own.energy_j))
        for gpu in gpus:
            per_gpu[gpu] = window(samples[first], samples[last], [gpu]).power_w * time_s
    return PhaseResult(
        iterations=count,
        iteration_time_s=iteration_time_s,
        energy_per_iteration_j=energy.power_w * iteration_time_s,
        power_w=energy.power_w,
        energy_j=energy.energy_j,
        duration_s=energy.duration_s,
        pipeline_iteration_times_s=times_s,
        pipelines=tuple(pipelines),
        gpu_energy_per_iteration_j=per_gpu,
    )


def rows_between(
    first: int,
    last: int,
    samples: Mapping[int, CounterSample],
    starts: Mapping[int, float],
    phases: Mapping[int, str],
) -> list[IterationRow]:
    """Rows of iterations first..last-1 from the samples at `first` and `last` (pipeline 0's starts)."""
    energy_j = (samples[last].total_j - samples[first].total_j) / (last - first)
    return [IterationRow(k, phases[k], starts[k + 1] - starts[k], energy_j) for k in range(first, last)]

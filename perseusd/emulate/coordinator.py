"""The coordinator: runs the stage processes through the phases and measures each phase.

It starts the stages and waits until every one holds its GPU, starts training, and then follows pipeline 0's
iteration starts: at each one it samples the GPUs' energy counters of every daemon (`measure`), asks the
daemons for the job's state once the stages registered, and lets the phase machine (`phases`) decide. When the
job first runs on every daemon it tells the pipelines' first stages (the straggler's closed-loop window counts
from there). Any stage failure, a stage process that dies, a failed job or the overall timeout ends the run;
the stages are always shut down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from perseusd.emulate.daemons import Daemons, DaemonUnreachableError, combined_state, summary_job
from perseusd.emulate.measure import CounterSample, CounterSampler
from perseusd.emulate.messages import (
    Command,
    IterationBegan,
    Registered,
    Report,
    StageDone,
    StageFailed,
    StageReady,
)
from perseusd.emulate.phases import PhaseConfig, PhaseMachine
from perseusd.emulate.preflight import EmulateError, JobLayout
from perseusd.emulate.processes import StageGroup
from perseusd.emulate.results import IterationRow, RunResult, phase_result, rows_between
from perseusd.emulate.trace import TraceWriter

READY_TIMEOUT_S = 120.0
"""Spawning a stage imports the package and connects: slow on a loaded machine, but not this slow."""
REPORT_WAIT_S = 0.2
STOP_TIMEOUT_S = 30.0
"""Stages stop at their next iteration start; then they release their GPUs and exit."""
UNREACHABLE_LIMIT_S = 120.0
"""A daemon may be away this long (killed and restarted, as a node's daemon under systemd): its iterations go
unsampled meanwhile (phase windows are measured between samples); longer fails the run."""


@dataclass(frozen=True)
class ProfileToImport:
    """A profile the daemon gets before the stages register, so the job skips online profiling."""

    csv: str
    source: str
    p_block_w: float


@dataclass(frozen=True)
class CoordinatorOptions:
    job: str
    phases: PhaseConfig
    timeout_s: float
    policy: str | None = None
    target: float = 0.0
    profile_import: ProfileToImport | None = None


@dataclass
class _Progress:
    """What the run has seen so far."""

    starts: list[dict[int, float]]
    samples: dict[int, CounterSample] = field(default_factory=dict)
    phases: dict[int, str] = field(default_factory=dict)
    last_sampled: int | None = None
    done: int = 0
    stopping: bool = False
    running_sent: bool = False
    unreachable_since_s: float | None = None


class Coordinator:
    """One run of the emulated job. `run` returns the result (with `failure` set when it failed)."""

    def __init__(
        self,
        daemons: Daemons,
        layout: JobLayout,
        group: StageGroup,
        options: CoordinatorOptions,
        on_row: Callable[[IterationRow], None],
        trace: TraceWriter,
    ) -> None:
        self._daemons = daemons
        self._layout = layout
        self._group = group
        self._options = options
        self._on_row = on_row
        self._trace = trace
        self._machine = PhaseMachine(options.phases)
        self._sampler = CounterSampler(daemons.read_counters, layout.all_counter_keys)
        self._progress = _Progress(starts=[{} for _ in layout.gpus])
        self._result = RunResult()
        self._deadline_s = time.monotonic() + options.timeout_s

    def run(self) -> RunResult:
        """Start the stages, train through the phases, stop the stages. SIGINT/SIGTERM propagate."""
        try:
            self._group.start()
            self._wait_ready()
            self._group.send_all(Command("start"))
            self._train()
            self._group.wait(STOP_TIMEOUT_S)
        except EmulateError as exc:
            self._result.failure = str(exc)
        finally:
            self._group.shutdown()
        self._collect_phases()
        return self._result

    def _check_deadline(self) -> None:
        if time.monotonic() > self._deadline_s:
            raise EmulateError(f"the run did not finish within {self._options.timeout_s:g} s (--timeout-s)")

    def _wait_ready(self) -> None:
        ready = 0
        deadline_s = time.monotonic() + READY_TIMEOUT_S
        while ready < self._group.size:
            if time.monotonic() > deadline_s:
                raise EmulateError(f"only {ready} of {self._group.size} stages started")
            self._check_deadline()
            for report in self._group.next_reports(REPORT_WAIT_S):
                if isinstance(report, StageReady):
                    ready += 1
                else:
                    self._handle(report)
            self._check_processes()

    def _train(self) -> None:
        progress = self._progress
        while not (progress.stopping and progress.done == self._group.size):
            self._check_deadline()
            for report in self._group.next_reports(REPORT_WAIT_S):
                self._handle(report)
            self._check_processes()
            latest = max(progress.starts[0], default=None)
            if not progress.stopping and latest is not None and latest != progress.last_sampled:
                self._on_iteration(latest)

    def _check_processes(self) -> None:
        dead = self._group.exited_unexpectedly()
        if dead:
            raise EmulateError(f"stage process {dead[0]} died")

    def _handle(self, report: Report) -> None:
        progress = self._progress
        if isinstance(report, StageFailed):
            raise EmulateError(f"pipeline {report.pipeline} stage {report.stage}: {report.message}")
        if isinstance(report, IterationBegan):
            progress.starts[report.pipeline][report.iteration] = report.start_s
            if report.pipeline == 0 and report.command == "register":
                self._machine.registered(report.iteration)
        elif isinstance(report, Registered):
            self._result.cached = self._result.cached or report.cached
        elif isinstance(report, StageDone):
            progress.done += 1
            if not progress.stopping:
                raise EmulateError(f"pipeline {report.pipeline} stage {report.stage} stopped early")

    def _on_iteration(self, iteration: int) -> None:
        """Pipeline 0 began `iteration`: sample, ask the daemon, advance the phases."""
        progress = self._progress
        try:
            sample = self._sampler.sample()
            state, error = self._job_state() if self._machine.registered_at is not None else (None, "")
        except DaemonUnreachableError as exc:
            since_s = progress.unreachable_since_s = progress.unreachable_since_s or time.monotonic()
            if time.monotonic() - since_s > UNREACHABLE_LIMIT_S:
                raise EmulateError(f"{exc} (for over {UNREACHABLE_LIMIT_S:g} s)") from None
            return  # this iteration goes unsampled
        progress.unreachable_since_s = None
        progress.samples[iteration] = sample
        self._trace.write([{"kind": "sample", "iteration": iteration, **_sample_record(sample)}])
        decision = self._machine.on_iteration(iteration, state, error)
        progress.phases[iteration] = decision.label
        if progress.last_sampled is not None:
            for k in range(progress.last_sampled + 1, iteration):
                progress.phases[k] = progress.phases[progress.last_sampled]
            rows = rows_between(
                progress.last_sampled, iteration, progress.samples, progress.starts[0], progress.phases
            )
            for row in rows:
                self._result.rows.append(row)
                self._on_row(row)
        progress.last_sampled = iteration
        if decision.failure:
            raise EmulateError(decision.failure)
        if self._machine.running_at is not None and not progress.running_sent:
            self._group.send_leaders(Command("running", after_iteration=self._machine.running_at))
            self._result.running_iteration = self._machine.running_at
            progress.running_sent = True
        if decision.command == "register":
            self._import_profile()
            self._group.send_leaders(Command("register"))
        elif decision.command == "stop":
            self._group.send_leaders(Command("stop", after_iteration=iteration))
            self._group.end_sync()
            progress.stopping = True

    def _import_profile(self) -> None:
        imported = self._options.profile_import
        if imported is not None:
            self._daemons.import_profile(imported.csv, imported.source, imported.p_block_w)

    def _job_state(self) -> tuple[str | None, str]:
        """The job's state combined over the daemons, and the failure reason; sets the policy once."""
        jobs = self._daemons.jobs(self._options.policy, self._options.target)
        self._result.daemon_jobs = jobs
        if any(job is not None for job in jobs):
            self._result.job = summary_job(jobs)
        return combined_state(jobs)

    def _collect_phases(self) -> None:
        """The phases measured completely (a failed run keeps its baseline)."""
        progress = self._progress
        for phase, span in self._machine.windows.items():
            if not all(span[0] in starts and span[1] in starts for starts in progress.starts):
                continue  # a pipeline stopped before the window's end
            result = phase_result(span, progress.samples, progress.starts, self._layout.counter_keys)
            self._trace.write(
                [
                    {
                        "kind": "window",
                        "phase": phase,
                        "first": span[0],
                        "last": span[1],
                        "start": _sample_record(progress.samples[span[0]]),
                        "end": _sample_record(progress.samples[span[1]]),
                    }
                ]
            )
            if phase == "baseline":
                self._result.baseline = result
            else:
                self._result.optimized = result


def _sample_record(sample: CounterSample) -> dict[str, dict[str, float]]:
    return {"time_s": dict(sample.time_s), "energy_j": dict(sample.energy_j)}

"""The emulator's phases as an explicit state machine, driven by sampled iteration starts (no I/O here).

    warmup -> baseline (all-max clocks, measured) -> closed loop (registered: the daemon profiles, solves,
    then runs its plan) -> settle (`settle_iterations`) -> optimized (measured) -> done

The coordinator samples the energy counters at (or shortly after) iteration starts of pipeline 0 and feeds
each sampled iteration with the job's state to `PhaseMachine.on_iteration`, which names the phase of that
iteration, marks measurement windows (sampled iterations where a window starts and ends) and says when to
send "register" or "stop". Windows are [start, end) in iterations: the end sample is taken as `end` begins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from perseusd.emulate.messages import CommandKind

RUNNING = "running"
FAILED = "failed"
SETTLE_ITERATIONS = 2
"""Default iterations between the plan running and the optimized window (the first may begin under old
clocks)."""
STRAGGLER_SETTLE_ITERATIONS = 8
"""With a straggler, the default settle is its FROM plus this: the daemons detect it and re-plan first."""


class Stage(Enum):
    WARMUP = "warmup"
    BASELINE = "baseline"
    CLOSED_LOOP = "closed_loop"
    SETTLE = "settle"
    OPTIMIZED = "optimized"
    DONE = "done"


@dataclass(frozen=True)
class PhaseConfig:
    """How many iterations each phase takes."""

    baseline_iterations: int
    iterations: int
    max_profiling_iterations: int
    baseline_only: bool = False
    warmup_iterations: int = 1
    settle_iterations: int = SETTLE_ITERATIONS


@dataclass(frozen=True)
class Decision:
    """What the coordinator does at a sampled iteration start."""

    label: str
    """The phase of the iteration that starts now (baseline, or the daemon's job state)."""
    command: CommandKind | None = None
    failure: str | None = None


@dataclass
class PhaseMachine:
    """Phases of one run; `windows` maps "baseline" / "optimized" to (start, end) iterations once complete."""

    config: PhaseConfig
    stage: Stage = Stage.WARMUP
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)
    registered_at: int | None = None
    running_at: int | None = None
    _window_start: int = 0

    def registered(self, iteration: int) -> None:
        """Pipeline 0's stages register with the daemon as `iteration` begins."""
        if self.registered_at is None:
            self.registered_at = iteration

    def on_iteration(self, iteration: int, job_state: str | None, job_error: str = "") -> Decision:
        """Advance on a sampled start of `iteration`; `job_state` is the daemon's (None before it knows)."""
        if self.stage is Stage.WARMUP:
            if iteration < self.config.warmup_iterations:
                return Decision("warmup")
            self._start(Stage.BASELINE, iteration)
        if self.stage is Stage.BASELINE:
            return self._baseline(iteration)
        if self.stage is Stage.DONE:
            return Decision(job_state or "baseline")
        if self.registered_at is None or iteration < self.registered_at:
            return Decision("baseline")  # "register" is sent; the stages apply it at their next iteration
        label = job_state or "registering"
        if job_state == FAILED:
            return Decision(label, failure=f"the daemon failed the job: {job_error or 'no reason given'}")
        return self._closed_loop(iteration, label, job_state)

    def _start(self, stage: Stage, iteration: int) -> None:
        self.stage = stage
        self._window_start = iteration

    def _baseline(self, iteration: int) -> Decision:
        if iteration < self._window_start + self.config.baseline_iterations:
            return Decision("baseline")
        self.windows["baseline"] = (self._window_start, iteration)
        if self.config.baseline_only:
            self.stage = Stage.DONE
            return Decision("baseline", command="stop")
        self.stage = Stage.CLOSED_LOOP
        return Decision("baseline", command="register")

    def _closed_loop(self, iteration: int, label: str, job_state: str | None) -> Decision:
        assert self.registered_at is not None
        if self.stage is Stage.CLOSED_LOOP:
            if job_state != RUNNING:
                if iteration - self.registered_at > self.config.max_profiling_iterations:
                    return Decision(
                        label,
                        failure=f"the job is still {label} after {self.config.max_profiling_iterations} "
                        "closed-loop iterations (--max-profiling-iterations)",
                    )
                return Decision(label)
            self.running_at = iteration
            self.stage = Stage.SETTLE
        if self.stage is Stage.SETTLE:
            assert self.running_at is not None
            if iteration < self.running_at + self.config.settle_iterations:
                return Decision(label)
            self._start(Stage.OPTIMIZED, iteration)
        if iteration < self._window_start + self.config.iterations:
            return Decision(label)
        self.windows["optimized"] = (self._window_start, iteration)
        self.stage = Stage.DONE
        return Decision(label, command="stop")

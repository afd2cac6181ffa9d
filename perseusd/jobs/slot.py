"""One registered GPU of a job (a pipeline stage): its events, its profiling sweep and its iteration times."""

from __future__ import annotations

import statistics
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from perseusd.gpu.reading import GpuReading
from perseusd.jobs.observed import OrderLearner
from perseusd.profiling.estimator import OptionEstimate, StageEstimate
from perseusd.profiling.sweep import StageSweep
from perseusd.profiling.trace import Interval, OptionKey

ITERATION_TIME_SAMPLES = 20
MAX_INTERVALS = 500_000

ComputationId = tuple[str, int, int]  # (instruction, microbatch, chunk)


@dataclass
class StageSlot:
    """A GPU running `stage` of `pipeline` for a job, registered by process `pid`."""

    gpu: str
    pipeline: int
    stage: int
    pid: int
    num_stages: int
    learner: OrderLearner
    supported_clocks_mhz: tuple[int, ...]
    sweep: StageSweep | None = None
    steps_done: int = 0
    in_step: bool = False
    # Profiling: the clock of the current iteration and whether it was applied before the iteration began.
    requested_mhz: int | None = None
    clock_future: Future[int] | None = None
    clock_applied_ns: int | None = None
    """When the requested clock's lock call returned (None: not yet): computations that began earlier ran
    at a mix of clocks."""
    blind_spans: list[tuple[int, int]] = field(default_factory=list)
    """(start, end) ns of the current segment's computations that began before its clock was applied."""
    capping_reads: list[Future[GpuReading]] = field(default_factory=list)
    """Reads of the GPU while it computed at the highest clock (is it power-capped, and where)."""
    iteration_clock_mhz: int | None = None
    profiling_since_ns: int = 0
    segment_since_ns: int = 0
    segment_iterations: int = 0
    """Profiling iterations at the current clock so far."""
    """Start of the current clock's segment: only its intervals and samples are estimated each iteration."""
    done_options: dict[tuple[OptionKey, int], OptionEstimate] = field(default_factory=dict)
    p_block_w: float | None = None
    waiting_w_by_clock: dict[int, float] = field(default_factory=dict)
    """The blocking power each finished profiling segment was estimated with, by its clock (W): regressed
    on the segment's idle time where that pins it down (`estimate_segment`)."""
    profiling_steps: int = 0
    open_since_ns: dict[ComputationId, int] = field(default_factory=dict)
    intervals: list[Interval] = field(default_factory=list)
    timed_computations: int = 0
    all_max_energy_j: float | None = None
    """One iteration's energy at all-max clocks, measured by the counter (profiling's first clock)."""
    all_max_iteration_s: float | None = None
    """The median iteration at all-max clocks, step begin to step begin (profiling's first clock)."""
    run_since_ns: int = 0
    """When the counter began to be sampled for the running plan (0: not yet)."""
    """Computations timed while profiling (their intervals are dropped clock by clock)."""
    estimate: StageEstimate | None = None
    last_step_begin_ns: int | None = None
    iterations: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=ITERATION_TIME_SAMPLES))
    """The last iterations, from consecutive step begins: (begin ns, seconds)."""
    running_steps: int = 0
    current_step: int = -1
    """The step of the last step begin (the step events' iteration number)."""
    plan_index: int | None = None
    """The frontier point whose plan this GPU runs."""
    group_lead: str | None = None
    """While its stage profiles: the GPU whose clocks this one follows (the first of its tensor-parallel
    group); None for that first GPU and for a stage of one GPU."""

    def key(self, instruction: str, chunk: int) -> OptionKey:
        """The profile stage (virtual stage) and instruction of a computation on this GPU."""
        return (chunk * self.num_stages + self.stage, instruction)

    def clock_applied(self) -> bool:
        """Whether the clock requested for profiling is in force (its GPU call finished without error)."""
        future = self.clock_future
        return future is not None and future.done() and future.exception() is None

    def step_begin(self, t_ns: int) -> None:
        if self.last_step_begin_ns is not None and t_ns > self.last_step_begin_ns:
            self.iterations.append((self.last_step_begin_ns, (t_ns - self.last_step_begin_ns) / 1e9))
        self.last_step_begin_ns = t_ns
        self.in_step = True
        self.open_since_ns.clear()
        future = self.clock_future
        pending_or_applied = future is not None and (not future.done() or future.exception() is None)
        self.iteration_clock_mhz = self.requested_mhz if pending_or_applied else None

    def mean_iteration_time_s(self, since_ns: int = 0) -> float | None:
        """The mean of the last iterations that began at `since_ns` or later (None: none yet): a counter's
        power over a span times this is the energy of one iteration of that span, not of one before it."""
        times = [seconds for begin_ns, seconds in self.iterations if begin_ns >= since_ns]
        return sum(times) / len(times) if times else None

    def median_recent_iteration_s(self, count: int) -> float | None:
        """The median of the last `count` iteration times (None: none yet)."""
        recent = [seconds for _, seconds in self.iterations][-count:] if count > 0 else []
        return statistics.median(recent) if recent else None

"""Stragglers, pure logic: per-pipeline compute time, hysteresis detection, and which frontier point to run.

A data-parallel job's pipelines meet at every iteration's gradient sync, so a slow pipeline (a straggler)
makes every other one wait. A pipeline's *compute time* for a step is its first stage's step begin to its
last computation's end (waiting at the sync afterwards is left out); its *slowness* is that time over the
time of the frontier point it runs: about 1 when healthy, the straggling factor when throttled. A pipeline
straggles when its slowness exceeds the median of the others' by more than its margin for `iterations`
steps in a row, and recovers after `iterations` steps below `clear_threshold` (hysteresis both ways). The
margin is `threshold` or, when the pipeline's healthy steps are noisier than that (a loaded CPU), three
times their measured spread up to `NOISE_MARGIN_MAX` (and the recovery margin at least one spread), so
noise never reads as a straggler; a pipeline is judged only after `NOISE_MIN_SAMPLES` steps. After every
re-plan the job's detectors start over and hold for `hold_iterations` steps (plans and measurements
settle), so a real change causes one re-plan and noise none.

An announced straggler (operator or framework) always wins over a detected or cluster one.

While a pipeline straggles by k, the others run the least-energy point whose time is at most k times the
fastest point's (waiting at blocking power counted), and the straggler itself runs the fastest point: no
plan change ever makes the job slower than its slowest pipeline already is.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from perseusd.planner.policy import PointSummary
from perseusd.planner.straggler import choose_point

NOISE_SAMPLES = 24
"""Healthy steps whose spread (median absolute deviation) sets a pipeline's noise margin."""
NOISE_MIN_SAMPLES = 8
"""Steps a pipeline runs before it can be detected, and healthy steps that make its noise known."""
NOISE_SIGMAS = 3.0
NOISE_MARGIN_MAX = 0.15
"""The noise margin never exceeds this: a straggler slower than x1.15 is caught on any machine."""
COMPUTE_TIME_SAMPLES = 3
"""Steps whose median is a pipeline's compute time: one odd step (a hiccup) never moves it."""
OPEN_STEPS_MAX = 8
"""Steps a pipeline tracks at once; older unfinished ones (a stage that never ended them) are dropped."""


@dataclass(frozen=True)
class StragglerSettings:
    threshold: float = 0.05
    """A pipeline straggles when its slowness exceeds the others' median by this fraction ..."""
    clear_threshold: float = 0.02
    """... and recovers when it is back within this fraction ..."""
    iterations: int = 3
    """... for this many steps in a row (either way)."""
    hold_iterations: int = 6
    """After a re-plan, steps before any detector may decide again (plans and measurements settle)."""


@dataclass(frozen=True)
class ActiveStraggler:
    """The straggler a job plans around: its pipeline, factor, who said so and the step it began."""

    pipeline: int
    factor: float
    source: str  # "detected", "announced" or "cluster"
    since_step: int


@dataclass
class _StepSpan:
    begin_ns: int
    end_ns: int = 0
    stages_ended: int = 0


class Detector:
    """Hysteresis on one pipeline's relative slowness (its slowness over the others' median), with a margin
    that grows with the pipeline's measured noise."""

    def __init__(self, settings: StragglerSettings) -> None:
        self._settings = settings
        self._recent: deque[float] = deque(maxlen=settings.iterations)
        self._healthy: deque[float] = deque(maxlen=NOISE_SAMPLES)
        self._run = 0
        self._seen = 0
        self.straggling = False
        self.factor = 1.0

    def spread(self) -> float | None:
        """The pipeline's noise: a robust standard deviation (1.4826 x the median absolute deviation) of its
        steps while the job had no straggler (None until known)."""
        if len(self._healthy) < NOISE_MIN_SAMPLES:
            return None
        center = statistics.median(self._healthy)
        return 1.4826 * statistics.median(abs(value - center) for value in self._healthy)

    def margin(self) -> float:
        """How far above the others a step must be to count toward straggling."""
        spread = self.spread()
        if spread is None:
            return self._settings.threshold
        return max(self._settings.threshold, min(NOISE_SIGMAS * spread, NOISE_MARGIN_MAX))

    def clear_margin(self) -> float:
        """How close to the others a step must be to count toward recovery."""
        spread = self.spread()
        if spread is None:
            return self._settings.clear_threshold
        return max(self._settings.clear_threshold, min(spread, NOISE_MARGIN_MAX / NOISE_SIGMAS))

    def restart(self) -> None:
        """Forget the current run of steps (after a re-plan: earlier steps ran other plans)."""
        self._run = 0
        self._recent.clear()

    def observe(self, relative: float, *, calm: bool = True) -> bool:
        """One step's relative slowness; True when the pipeline started or stopped straggling. `calm`: no
        straggler anywhere in the job, so the step may count toward the noise margin."""
        settings = self._settings
        self._recent.append(relative)
        self._seen += 1
        if not self.straggling:
            above = relative > 1.0 + self.margin()
            if calm:  # a median-centred spread: a few slow steps among them do not move it
                self._healthy.append(relative)
            self._run = self._run + 1 if above else 0
            if self._run >= settings.iterations and self._seen >= NOISE_MIN_SAMPLES:
                self.straggling, self._run = True, 0
                self.factor = statistics.median(self._recent)
                return True
            return False
        self._run = self._run + 1 if relative < 1.0 + self.clear_margin() else 0
        if self._run >= settings.iterations:
            self.straggling, self._run, self.factor = False, 0, 1.0
            return True
        return False


@dataclass
class PipelineRun:
    """One local pipeline of a running job: its steps' spans, compute times, detector and plan."""

    pipeline: int
    num_stages: int
    detector: Detector
    point_index: int | None = None
    plan_since_step: int | None = None
    pending: tuple[int, int] | None = None
    """(frontier point, first step) the pipeline switches to at that step's boundary."""
    latest_step: int = -1
    last_done_step: int = -1
    compute_times_s: deque[float] = field(default_factory=lambda: deque(maxlen=COMPUTE_TIME_SAMPLES))
    _spans: dict[int, _StepSpan] = field(default_factory=dict)

    def step_begin(self, step: int, t_ns: int) -> None:
        span = self._spans.get(step)
        if span is None:
            self._spans[step] = _StepSpan(t_ns)
            for old in sorted(self._spans)[:-OPEN_STEPS_MAX]:
                del self._spans[old]
        elif t_ns < span.begin_ns:
            span.begin_ns = t_ns
        self.latest_step = max(self.latest_step, step)

    def computation_end(self, step: int, t_ns: int) -> None:
        span = self._spans.get(step)
        if span is not None and t_ns > span.end_ns:
            span.end_ns = t_ns

    def stage_ended(self, step: int) -> float | None:
        """A stage ended `step`; the step's compute time (s) once every stage did, else None."""
        span = self._spans.get(step)
        if span is None:
            return None
        span.stages_ended += 1
        if span.stages_ended < self.num_stages:
            return None
        del self._spans[step]
        self.last_done_step = max(self.last_done_step, step)
        if span.end_ns <= span.begin_ns:
            return None
        compute_s = (span.end_ns - span.begin_ns) / 1e9
        self.compute_times_s.append(compute_s)
        return compute_s

    def compute_time_s(self) -> float | None:
        return statistics.median(self.compute_times_s) if self.compute_times_s else None

    def slowness(self, points: dict[int, PointSummary], *, last_step: bool = False) -> float | None:
        """Compute time (the recent median, or the last step's) over the running point's time (None until
        both are known)."""
        compute_s = self.compute_times_s[-1] if last_step and self.compute_times_s else self.compute_time_s()
        point = points.get(self.point_index) if self.point_index is not None else None
        if compute_s is None or point is None or point.time_s <= 0:
            return None
        return compute_s / point.time_s

    def target_index(self) -> int | None:
        """The point this pipeline runs or is about to."""
        return self.pending[0] if self.pending is not None else self.point_index


def relative_slowness(own: float, others: list[float]) -> float | None:
    """`own` over the median of `others` (None without others: a lone pipeline makes nobody wait)."""
    usable = [s for s in others if s > 0]
    if not usable:
        return None
    return own / statistics.median(usable)


def pick_straggler(candidates: list[ActiveStraggler]) -> ActiveStraggler | None:
    """The straggler to plan around: an announced one always wins over detected and cluster ones (the
    operator or framework knows); among equals the slowest (the job waits for it anyway), then the lowest
    pipeline."""
    if not candidates:
        return None
    announced = [s for s in candidates if s.source == "announced"]
    return max(announced or candidates, key=lambda s: (s.factor, -s.pipeline))


def point_for(
    pipeline: int,
    straggler: ActiveStraggler | None,
    points: list[PointSummary],
    base: PointSummary,
    fastest: PointSummary,
    num_stages: int,
    p_block_w: float,
) -> PointSummary:
    """The point `pipeline` runs: its policy's `base` point, or with a straggler elsewhere the least-energy
    point no slower than the straggler (k x the fastest time), waiting at blocking power counted. The
    straggler itself runs the fastest point; a slower straggler never makes anyone faster than `base`."""
    if straggler is None:
        return base
    if straggler.pipeline == pipeline:
        return fastest
    target_s = straggler.factor * fastest.time_s
    if target_s <= base.time_s:
        return base
    chosen = choose_point(points, target_s, num_stages, p_block_w)
    assert isinstance(chosen, PointSummary)
    return chosen


def target_time_s(straggler: ActiveStraggler | None, fastest: PointSummary | None) -> float | None:
    """The iteration time the other pipelines plan for (None without a straggler)."""
    if straggler is None or fastest is None:
        return None
    return straggler.factor * fastest.time_s

"""The emulated straggler (`--straggler PIPELINE:FACTOR[:FROM[:TO]]`): which iterations a pipeline throttles.

Every stage of the straggler pipeline runs its computations FACTOR times longer at the same power
(`SimGpuHandle.throttle`) during the whole baseline (so the baseline is all-max clocks under the same
straggler) and, in the closed loop, from FROM to TO iterations after the job is first running. It never
throttles during warm-up, online profiling or solving: the daemon must profile healthy GPUs. The pipeline's
first stage decides the factor at each iteration start (`ThrottleSchedule.factor_at`) and passes it down the
pipeline with the iteration start, so all its stages switch at the same iteration.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

HEALTHY = 1.0


@dataclass(frozen=True)
class StragglerSpec:
    """Pipeline `pipeline` is `factor` times slower; in the closed loop in iterations [R + from, R + to) where
    R is the job's first running iteration."""

    pipeline: int
    factor: float
    from_iterations: int = 0
    to_iterations: int | None = None
    """None: to the end of the run."""


def parse_straggler(text: str) -> StragglerSpec:
    """argparse `type=` for PIPELINE:FACTOR[:FROM[:TO]] (factor >= 1, 0 <= FROM < TO)."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(f"'{text}' is not PIPELINE:FACTOR[:FROM[:TO]] (e.g. 0:1.2)")
    try:
        pipeline, factor = int(parts[0]), float(parts[1])
        from_iterations = int(parts[2]) if len(parts) > 2 else 0
        to_iterations = int(parts[3]) if len(parts) > 3 else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}': PIPELINE, FROM and TO are integers, FACTOR a number (e.g. 0:1.2:0:20)"
        ) from None
    if pipeline < 0 or from_iterations < 0:
        raise argparse.ArgumentTypeError(f"'{text}': PIPELINE and FROM must not be negative")
    if not factor >= 1.0 or factor == float("inf"):
        raise argparse.ArgumentTypeError(f"'{text}': FACTOR must be a finite number >= 1 (got {parts[1]})")
    if to_iterations is not None and to_iterations <= from_iterations:
        raise argparse.ArgumentTypeError(
            f"'{text}': TO ({to_iterations}) must be after FROM ({from_iterations})"
        )
    return StragglerSpec(pipeline, factor, from_iterations, to_iterations)


@dataclass
class ThrottleSchedule:
    """A pipeline's throttle by iteration; kept by its first stage.

    Args:
        factor: the straggler's factor (1 for a healthy pipeline).
        warmup_iterations: iterations before the baseline (never throttled).
        from_iterations, to_iterations: the closed-loop window, relative to the job's first running iteration.
    """

    factor: float
    warmup_iterations: int
    from_iterations: int = 0
    to_iterations: int | None = None
    registered_at: int | None = None
    running_at: int | None = None

    def registered(self, iteration: int) -> None:
        """The pipeline registers with the daemon as `iteration` begins: the baseline is over."""
        if self.registered_at is None:
            self.registered_at = iteration

    def running(self, iteration: int) -> None:
        """The coordinator saw the job running from `iteration` on."""
        if self.running_at is None:
            self.running_at = iteration

    def factor_at(self, iteration: int) -> float:
        """The throttle factor of `iteration`."""
        if self.factor == HEALTHY or iteration < self.warmup_iterations:
            return HEALTHY
        if self.registered_at is None or iteration < self.registered_at:
            return self.factor  # the baseline (and the iterations until the stages register)
        if self.running_at is None or iteration < self.running_at + self.from_iterations:
            return HEALTHY  # profiling, solving, or not yet
        if self.to_iterations is not None and iteration >= self.running_at + self.to_iterations:
            return HEALTHY
        return self.factor

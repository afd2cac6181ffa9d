"""What jobs take from the daemon: their settings (from its configuration) and the GPUs' calls they use."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from perseusd.gpu.backend import GpuInfo
from perseusd.gpu.reading import GpuReading
from perseusd.jobs.straggling import StragglerSettings
from perseusd.planner.policy import Policy
from perseusd.profiling.sweep import SweepSettings


class JobGpus(Protocol):
    """What the manager needs of the GPU registry."""

    def info(self, uuid: str) -> GpuInfo: ...
    def clock_set_latencies_s(self, uuid: str) -> tuple[float, ...]: ...
    def submit_read(self, uuid: str) -> Future[GpuReading]: ...
    @property
    def uuids(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class JobSettings:
    """Job behaviour from the daemon configuration."""

    warmup_iterations: int = 2
    max_profiling_iterations: int = 300
    unit_time_s: float = 0.0
    """The solver's time quantum; 0: automatic (shortest computation / 50, on a 1-2-5 step)."""
    policy: Policy = field(default_factory=Policy)
    clock_lead_s: float = 0.002
    """The margin added to the measured clock-set latency when raising early (0: raises wait for the end)."""
    fill_clocks: bool = True
    """Add options at the clocks the sweep did not visit from each key's trusted fit (`profiling.fill`)."""
    sweep: SweepSettings = field(default_factory=SweepSettings)
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    max_job_computations: int = 4096
    """The largest schedule a job may register (stages x microbatches x chunks x 2): its schedule is built
    on the main loop and its solve's time and memory grow with it."""
    max_solves_per_user: int = 1
    """Solves of one user's jobs in the worker's queue at a time (the others wait their turn in `solving`):
    one user's many jobs never make another user's wait behind all of them."""
    solve_timeout_s: float = 900.0
    """A solve that runs longer fails its job (and frees the worker for the others)."""
    ramp_bound_w_per_s: float = 0.0
    """The node's bound on its plans' power steps at every 10 ms sample, each GPU held to its share
    (`jobs.ramp_bounding`); 0: none."""

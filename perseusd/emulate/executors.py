"""What a stage process runs its computations on: a simulated GPU, or real PyTorch layers on a real GPU.

Every stage of an emulated pipeline runs its schedule the same way (`stage_worker`); only the executor
differs:

- `SimExecutor`: the profile's time at the clock the daemon set, on a simulated GPU (`SimGpuHandle.run`);
- `perseusd.emulate.tensor_group.TensorGroup`: the same on a tensor-parallel stage's simulated GPUs, in step;
- `perseusd.emulate.torch_stage.TorchExecutor`: one pipeline stage of GPT-like layers executed by PyTorch on
  the CUDA device that is the daemon's real GPU (a `--backend mixed` daemon), waiting for its simulated
  neighbours the way a NCCL receive does. Imported only when a run has a real stage (it needs torch).

`perseusd.emulate.real_stage.RealStageSpec` says what the real stage computes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from perseusd.emulate.real_stage import RealStageSpec
from perseusd.planner.profile import Profile
from perseusd.workload.sim_workload import RunRecord, SimGpuHandle


class StageExecutor(Protocol):
    """Runs one stage's computations and says how its GPU waits for the neighbours."""

    def run(self, profile_stage: int, instruction: str, microbatch: int, time_scale: float) -> RunRecord:
        """Run one computation to its end on the GPU."""

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """Held while the stage waits for a neighbour's computation."""

    def iteration_done(self) -> None:
        """After the iteration's last computation (the optimizer's turn)."""

    def throttle(self, factor: float) -> None:
        """Make later computations `factor` times longer (straggler emulation)."""

    def describe(self) -> dict[str, str]:
        """What runs the computations, for the trace (`kind` "executor")."""

    def close(self) -> None: ...


class SimExecutor:
    """A simulated GPU: each computation holds it for the profile's time at the daemon's clock."""

    def __init__(self, sim_dir: str, gpu: str, profile: Profile | None) -> None:
        self._handle = SimGpuHandle.open(sim_dir, gpu, profile)

    def run(
        self,
        profile_stage: int,
        instruction: str,
        microbatch: int,  # noqa: ARG002 (a simulated computation costs the same for every microbatch)
        time_scale: float,
    ) -> RunRecord:
        return self._handle.run(profile_stage, instruction, time_scale)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        yield  # an idle simulated GPU draws its board's idle power at the locked clock

    def iteration_done(self) -> None:
        """Nothing to do: the profile's costs are the whole iteration."""

    def throttle(self, factor: float) -> None:
        self._handle.throttle(factor)

    def describe(self) -> dict[str, str]:
        return {"executor": "sim"}

    def close(self) -> None:
        self._handle.close()


@dataclass(frozen=True)
class StagePlace:
    """Where a stage sits in its pipeline: what its real layers must compute differently."""

    first: bool
    last: bool
    microbatches: int


def open_executor(
    sim_dir: str,
    gpu: str,
    profile: Profile | None,
    real: RealStageSpec | None,
    place: StagePlace,
    peers: Sequence[str] = (),
) -> StageExecutor:
    """The executor of one stage: real layers when `real` is given (the run's real stage on a GPU that is not
    simulated), otherwise the simulated GPU, or with `peers` the stage's tensor-parallel simulated GPUs."""
    if peers:
        from perseusd.emulate.tensor_group import TensorGroup

        return TensorGroup.open(sim_dir, (gpu, *peers), profile)
    if real is not None:
        from perseusd.emulate.torch_stage import TorchExecutor

        return TorchExecutor(real, gpu, first=place.first, last=place.last, microbatches=place.microbatches)
    return SimExecutor(sim_dir, gpu, profile)

"""The simulated GPUs of one emulated stage: one, or several running in step (tensor parallelism).

Tensor-parallel GPUs split every layer of the stage and meet at its collectives, so a computation of the stage
runs on all of them at once and ends when the slowest has finished
(`perseusd.workload.sim_group.run_together`, one thread polling every GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from perseusd.planner.profile import Profile
from perseusd.workload.sim_group import run_together
from perseusd.workload.sim_workload import RunRecord, SimGpuHandle


class TensorGroup:
    """A stage's simulated GPUs; `close` closes them."""

    def __init__(self, handles: Sequence[SimGpuHandle]) -> None:
        self._handles = tuple(handles)
        self.last_clocks_mhz: tuple[int, ...] = ()
        """The clock each GPU began the last computation at."""

    @classmethod
    def open(cls, sim_dir: Path | str, uuids: Sequence[str], profile: Profile | None) -> TensorGroup:
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(SimGpuHandle.open(sim_dir, uuid, profile)) for uuid in uuids]
            stack.pop_all()
        return cls(handles)

    def throttle(self, factor: float) -> None:
        for handle in self._handles:
            handle.throttle(factor)

    def run(
        self,
        stage: int,
        instruction: str,
        microbatch: int,  # noqa: ARG002 (a simulated computation costs the same for every microbatch)
        time_scale: float,
    ) -> RunRecord:
        """Run one computation on every GPU of the stage: the first GPU's record, lasting until the last GPU
        finished, with the energy of all (`gpu_energy_j`: the GPUs' together as each began)."""
        if len(self._handles) == 1:
            record = self._handles[0].run(stage, instruction, time_scale)
            self.last_clocks_mhz = (record.clock_mhz,)
            return record
        records = run_together(self._handles, stage, instruction, time_scale)
        self.last_clocks_mhz = tuple(r.clock_mhz for r in records)
        end_s = max(r.start_s + r.duration_s for r in records)
        first = records[0]
        begun = [r.gpu_energy_j for r in records]
        return replace(
            first,
            duration_s=end_s - first.start_s,
            energy_j=sum(r.energy_j for r in records),
            gpu_energy_j=None if None in begun else sum(j for j in begun if j is not None),
        )

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        yield  # idle simulated GPUs draw their board's idle power at the locked clock

    def iteration_done(self) -> None:
        """Nothing to do: the profile's costs are the whole iteration."""

    def describe(self) -> dict[str, str]:
        return {"executor": "sim", "gpus": str(len(self._handles))}

    def close(self) -> None:
        for handle in self._handles:
            handle.close()

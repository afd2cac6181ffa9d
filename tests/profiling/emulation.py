"""One pipeline stage of a training job emulated on a real simulated GPU, on a fake clock.

The stage runs its computations in schedule order (1F1B or interleaved 1F1B) at the start times the whole
pipeline's DAG gives them (every stage at the same clock), so its idle bubbles are the real ones; the workload
side (`SimGpuHandle`) really runs each computation on the simulated GPU and the daemon side (`SimDevice`)
publishes its energy counter every update period with noise. As the fake clock advances, the counter is
sampled every ~10 ms (with jitter) into a `CounterTrace`, as the daemon's sampler would do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from perseusd.gpu.sim import SimBackend
from perseusd.planner.dag import ComputationDag, build_dag
from perseusd.profiling.trace import CounterTrace, Interval, OptionKey
from perseusd.workload.sim_costs import WorkloadCosts
from perseusd.workload.sim_workload import RunRecord, SimGpuHandle

NS_PER_S = 1_000_000_000


class SampledTime:
    """A fake CLOCK_MONOTONIC (integer ns) that moves only in `sleep`, calling `on_sample` every ~10 ms."""

    def __init__(self, *, start_ns: int, sample_period_ns: int, jitter_ns: int, seed: int) -> None:
        self.now_ns = start_ns
        self._period_ns = sample_period_ns
        self._jitter_ns = jitter_ns
        self._rng = random.Random(seed)
        self._next_sample_ns = start_ns
        self.on_sample: Callable[[int], None] = lambda _t_ns: None

    def clock(self) -> float:
        return self.now_ns / NS_PER_S

    def sleep(self, duration_s: float) -> None:
        self.advance_to(self.now_ns + round(duration_s * NS_PER_S))

    def advance_to(self, until_ns: int) -> None:
        while self._next_sample_ns <= until_ns:
            self.now_ns = max(self.now_ns, self._next_sample_ns)
            self.on_sample(self.now_ns)
            self._next_sample_ns += self._period_ns + self._rng.randrange(self._jitter_ns + 1)
        self.now_ns = max(self.now_ns, until_ns)


class StageEmulator:
    """Stage `stage` of an S x M pipeline on simulated GPU 0 of a fresh `SimBackend` in `sim_dir`.

    Args:
        num_chunks: model chunks per stage (> 1: interleaved 1F1B; virtual stage = chunk * S + stage).
        time_scale: multiplies every computation's time and energy (power stays the profile's).
        gap_s: idle time between iterations (optimizer step, unscaled).
    """

    def __init__(
        self,
        sim_dir: Path,
        *,
        model: str,
        num_stages: int,
        num_microbatches: int,
        num_chunks: int = 1,
        stage: int,
        time_scale: float = 1.0,
        gap_s: float = 0.02,
        noise: float = 0.01,
        update_period_s: float = 0.1,
        seed: int = 0,
    ) -> None:
        self.time = SampledTime(
            start_ns=1000 * NS_PER_S, sample_period_ns=10_000_000, jitter_ns=500_000, seed=seed
        )
        self.backend = SimBackend(
            sim_dir,
            model=model,
            noise=noise,
            update_period_s=update_period_s,
            seed=seed,
            clock=self.time.clock,
            sleep=self.time.sleep,
            fresh=True,
        )
        self.device = self.backend.sim_devices()[0]
        self.handle = SimGpuHandle.open(
            sim_dir, self.device.info.uuid, clock=self.time.clock, sleep=self.time.sleep, clock_poll_s=None
        )  # clocks change only between iterations here
        self.trace = CounterTrace()
        self.intervals: list[Interval] = []
        self.records: list[RunRecord] = []
        self.locks_mhz: list[int] = []
        """The locked clock of each record (a record's own clock is the one that ran, lower when capped)."""
        self.time.on_sample = self._sample
        schedule = "interleaved" if num_chunks > 1 else "1f1b"
        self.dag: ComputationDag = build_dag(schedule, num_stages, num_microbatches, num_chunks)
        self.stage = stage
        self.time_scale = time_scale
        self._gap_ns = round(gap_s * NS_PER_S)

    @property
    def model(self) -> WorkloadCosts:
        """The workload's costs on the board (the bundled profile of the board's name)."""
        return self.handle.costs

    @property
    def keys(self) -> list[OptionKey]:
        """The (virtual stage, instruction) keys this stage runs."""
        nodes = self.dag.stage_orders[self.stage]
        found = {(self.dag.virtual_stage(n), self.dag.computations[n].instruction.value) for n in nodes}
        return sorted(found)

    def _sample(self, t_ns: int) -> None:
        self.trace.add(t_ns, self.device.energy_mj())

    def _node_time_s(self, node: int, clock_mhz: int) -> float:
        instruction = self.dag.computations[node].instruction.value
        return self.model.cost(self.dag.virtual_stage(node), instruction, clock_mhz).time_s * self.time_scale

    def _schedule_ns(self, clock_mhz: int) -> tuple[list[int], int]:
        """Start offsets (ns) of this stage's computations in one iteration, and the iteration's length."""
        finish_s = [0.0] * self.dag.num_computations
        start_s = [0.0] * self.dag.num_computations
        for node in self.dag.topological_order:
            start_s[node] = max((finish_s[p] for p in self.dag.predecessors[node]), default=0.0)
            finish_s[node] = start_s[node] + self._node_time_s(node, clock_mhz)
        offsets = [round(start_s[n] * NS_PER_S) for n in self.dag.stage_orders[self.stage]]
        return offsets, round(max(finish_s) * NS_PER_S)

    def run_iteration(self, clock_mhz: int, vary: Callable[[int], float] | None = None) -> None:
        """One training iteration with the GPU locked at `clock_mhz`.

        `vary(i)` multiplies the time (and energy) of the stage's i-th computation of the iteration.
        """
        self.device.set_locked_sm_clock_mhz(clock_mhz)
        begin_ns = self.time.now_ns
        offsets_ns, length_ns = self._schedule_ns(clock_mhz)
        for index, (node, offset_ns) in enumerate(
            zip(self.dag.stage_orders[self.stage], offsets_ns, strict=True)
        ):
            self.time.advance_to(begin_ns + offset_ns)
            computation = self.dag.computations[node]
            scale = self.time_scale * (vary(index) if vary is not None else 1.0)
            start_ns = self.time.now_ns
            record = self.handle.run(self.dag.virtual_stage(node), computation.instruction.value, scale)
            self.records.append(record)
            self.locks_mhz.append(clock_mhz)
            key = (record.stage, record.instruction)
            # labelled by the lock, as the daemon labels them
            self.intervals.append(Interval(key, clock_mhz, start_ns, self.time.now_ns))
        self.time.advance_to(max(begin_ns + length_ns, self.time.now_ns) + self._gap_ns)

    def close(self) -> None:
        self.handle.close()
        self.backend.close()

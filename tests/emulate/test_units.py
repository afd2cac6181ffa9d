"""Unit tests of the emulator's pure parts: neighbours, phases, and counter sampling on a simulated GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseusd.emulate.measure import CounterSampler, window
from perseusd.emulate.phases import PhaseConfig, PhaseMachine
from perseusd.emulate.topology import Neighbour, PipelineShape
from perseusd.gpu.sim import SimBackend
from perseusd.planner.dag import B, F, build_dag
from perseusd.workload.sim_workload import SimGpuHandle


def test_neighbours_follow_the_dag_edges() -> None:
    """Every cross-GPU edge of the planner's DAG is one source/destination pair, and nothing else is."""
    for shape in (PipelineShape(4, 8, 1, "1f1b"), PipelineShape(2, 4, 2, "interleaved")):
        dag = build_dag(shape.schedule, shape.num_stages, shape.num_microbatches, shape.num_chunks)
        for node, comp in enumerate(dag.computations):
            source = shape.source(comp.stage, comp.instruction, comp.chunk)
            cross = {
                Neighbour(dag.computations[p].stage, dag.computations[p].chunk)
                for p in dag.predecessors[node]
                if dag.computations[p].stage != comp.stage
            }
            assert cross == ({source} if source else set())


def test_interleaved_wraps_around_the_ring() -> None:
    shape = PipelineShape(2, 4, 2, "interleaved")
    assert shape.destination(1, F, 0) == Neighbour(0, 1)  # virtual stage 1 -> 2 is GPU 0 chunk 1
    assert shape.destination(0, B, 1) == Neighbour(1, 0)
    assert shape.source(1, B, 1) is None  # the last virtual stage: its backward follows its own forward
    assert shape.profile_stage(1, 1) == 3


def _machine(**kwargs: int | bool) -> PhaseMachine:
    config = {"baseline_iterations": 3, "iterations": 2, "max_profiling_iterations": 5, **kwargs}
    return PhaseMachine(PhaseConfig(**config))  # type: ignore[arg-type]


def test_phases_from_baseline_to_optimized() -> None:
    machine = _machine()
    assert machine.on_iteration(0, None).label == "warmup"
    assert [machine.on_iteration(k, None).command for k in (1, 2, 3)] == [None, None, None]
    decision = machine.on_iteration(4, None)
    assert (decision.label, decision.command) == ("baseline", "register")
    assert machine.windows == {"baseline": (1, 4)}
    assert machine.on_iteration(5, None).label == "baseline"  # the stages register at their next start
    machine.registered(6)
    assert machine.on_iteration(6, None).label == "registering"
    assert machine.on_iteration(7, "profiling").label == "profiling"
    assert machine.on_iteration(8, "running").command is None  # settle: 8, 9
    assert machine.on_iteration(10, "running").command is None  # the window starts here
    assert machine.on_iteration(12, "running").command == "stop"
    assert machine.windows["optimized"] == (10, 12)


def test_phases_fail_on_a_failed_job_and_on_endless_profiling() -> None:
    machine = _machine(baseline_iterations=1)
    machine.on_iteration(1, None)
    machine.on_iteration(2, None)
    machine.registered(3)
    failure = machine.on_iteration(4, "failed", "solver crashed").failure
    assert failure is not None
    assert "solver crashed" in failure
    machine = _machine(baseline_iterations=1)
    machine.on_iteration(1, None)
    machine.on_iteration(2, None)
    machine.registered(3)
    assert machine.on_iteration(8, "profiling").failure is None
    assert "--max-profiling-iterations" in (machine.on_iteration(9, "profiling").failure or "")


def test_baseline_only_stops_after_the_baseline() -> None:
    machine = _machine(baseline_only=True, baseline_iterations=2)
    machine.on_iteration(0, None)
    machine.on_iteration(1, None)
    assert machine.on_iteration(3, None).command == "stop"
    assert machine.windows == {"baseline": (1, 3)}


class _Time:
    """A shared fake CLOCK_MONOTONIC for the GPU, the workload and the sampler."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def clock(self) -> float:
        return self.now_s

    def sleep(self, duration_s: float) -> None:
        self.now_s += duration_s


def test_a_sample_is_the_exact_energy_when_the_counter_changes(tmp_path: Path) -> None:
    """With noise off the sampled value equals the GPU's exact energy at the sample's time."""
    fake = _Time()
    backend = SimBackend(tmp_path, gpus=1, noise=0.0, clock=fake.clock, sleep=fake.sleep, fresh=True)
    device = backend.sim_devices()[0]
    uuid = device.info.uuid
    handle = SimGpuHandle.open(tmp_path, uuid, clock=fake.clock, sleep=fake.sleep)
    sampler = CounterSampler(
        lambda: {uuid: device.energy_mj() / 1000.0}, [uuid], clock=fake.clock, sleep=fake.sleep
    )
    try:
        fake.sleep(0.037)
        first = sampler.sample()
        assert first.energy_j[uuid] == pytest.approx(device.true_energy_j(), abs=1e-3)
        for _ in range(7):
            handle.run(0, "forward")
        second = sampler.sample()
        assert second.energy_j[uuid] == pytest.approx(device.true_energy_j(), abs=1e-3)
        span = window(first, second)
        busy_j = 7 * handle.cost(0, "forward").energy_j
        idle_s = span.duration_s - 7 * handle.cost(0, "forward").time_s
        assert span.energy_j == pytest.approx(busy_j + idle_s * device.board.blocking_power_w, abs=2e-3)
        assert span.power_w == pytest.approx(span.energy_j / span.duration_s)
    finally:
        handle.close()
        backend.close()

"""`benchmarks/closed_loop_trace.py`: a trace played out with known durations, gap and hop is read back."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.closed_loop_trace import analyse, exact_energy, gpu_wrong_clock_fraction, replay_s
from perseusd.planner.dag import build_dag

STAGES, MICROBATCHES = 3, 4
GAP_S, HOP_S = 0.001, 0.0025


def _iteration(durations_s: list[float], iteration: int, origin_s: float) -> list[dict[str, Any]]:
    """One iteration's computation records, each computation beginning when the GPU is free (after GAP_S)
    and its input has arrived (HOP_S after the sender's end)."""
    dag = build_dag("1f1b", STAGES, MICROBATCHES)
    stage_of = [c.stage for c in dag.computations]
    start_s, end_s = [0.0] * dag.num_computations, [0.0] * dag.num_computations
    for node in dag.topological_order:
        ready = [
            end_s[p] + (GAP_S if stage_of[p] == stage_of[node] else HOP_S) for p in dag.predecessors[node]
        ]
        start_s[node] = max(ready, default=origin_s)
        end_s[node] = start_s[node] + durations_s[node]
    return [
        {
            "kind": "computation",
            "pipeline": 0,
            "stage": c.stage,
            "iteration": iteration,
            "instruction": c.instruction.value,
            "microbatch": c.microbatch,
            "start_s": start_s[node],
            "end_s": end_s[node],
        }
        for node, c in enumerate(dag.computations)
    ]


def test_the_gap_the_hop_and_each_phases_slowdown_are_read_back() -> None:
    dag = build_dag("1f1b", STAGES, MICROBATCHES)
    base = [0.010 if c.instruction.value == "forward" else 0.020 for c in dag.computations]
    slower = [t * (1.1 if c.stage == 0 else 1.0) for t, c in zip(base, dag.computations, strict=True)]
    records: list[dict[str, Any]] = []
    for iteration in range(6):
        records += _iteration(base if iteration < 3 else slower, iteration, origin_s=10.0 * iteration)
    records += [
        {"kind": "window", "phase": "baseline", "first": 0, "last": 3},
        {"kind": "window", "phase": "optimized", "first": 3, "last": 6},
    ]
    found = analyse(records)
    assert found["baseline"]["gap_ms"] == pytest.approx(GAP_S * 1e3)
    assert found["baseline"]["hop_ms"] == pytest.approx(HOP_S * 1e3)
    for phase, durations in (("baseline", base), ("optimized", slower)):
        assert found[phase]["dag_s"] == pytest.approx(replay_s(dag, durations, 0.0, 0.0), abs=1e-5)
        # the replay with the measured gap and hop is the span the records were played out with
        assert found[phase]["replayed_s"] == pytest.approx(found[phase]["span_s"], abs=1e-5)
    assert found["slowdown_pct"]["span"] > 0
    assert found["slowdown_pct"]["replayed"] == pytest.approx(found["slowdown_pct"]["span"], abs=1e-3)


def test_a_trace_without_both_windows_is_refused() -> None:
    with pytest.raises(SystemExit, match="baseline and optimized"):
        analyse([{"kind": "window", "phase": "baseline", "first": 0, "last": 3}])


def test_the_gpu_wrong_clock_share_counts_the_optimized_windows_begins_off_their_plan() -> None:
    """Within the optimized window, a computation that began at another locked clock than its plan's counts,
    unless the power cap held it below its planned clock (a lock above the plan's is wrong, capped or not);
    computations outside the window do not count."""
    plan = {
        "stages": [
            [{"instruction": "forward", "microbatch": m, "chunk": 0, "freq_mhz": 1200} for m in range(4)]
        ]
    }

    def record(iteration: int, microbatch: int, clock_mhz: int, capped: bool = False) -> dict[str, Any]:
        return {
            "kind": "computation",
            "pipeline": 0,
            "stage": 0,
            "iteration": iteration,
            "instruction": "forward",
            "microbatch": microbatch,
            "chunk": 0,
            "clock_mhz": clock_mhz,
            "capped": capped,
        }

    records = [
        {"kind": "window", "phase": "optimized", "first": 5, "last": 6},
        *(record(4, m, 1980) for m in range(4)),  # before the window: all-max
        record(5, 0, 1980),  # late
        record(5, 1, 1200),
        record(5, 2, 1140, capped=True),
        record(5, 3, 1200),
        *(record(6, m, 1200) for m in range(3)),
        record(6, 3, 1980, capped=True),  # late, at a clock the cap holds: late all the same
    ]
    assert gpu_wrong_clock_fraction(records, plan) == pytest.approx(2 / 8)
    assert gpu_wrong_clock_fraction(records[1:], plan) is None


def test_the_exact_saving_counts_each_gpus_energy_between_its_own_iteration_boundaries() -> None:
    """Per GPU, its exact energy as it began its first computation of the window's first and end iteration
    (a later computation of the same iteration does not move the boundary), summed over GPUs, per
    iteration; a window boundary without the GPU's energy gives no figure."""
    per_iteration_j = {"GPU-a": (100.0, 80.0), "GPU-b": (300.0, 255.0)}  # baseline, optimized

    def records(gpu: str, stage: int) -> list[dict[str, Any]]:
        found, energy_j = [], 7.0
        for iteration in range(7):
            spent_j = per_iteration_j[gpu][0 if iteration < 3 else 1]
            for k, share in enumerate((0.0, 0.4)):  # two computations, the second part-way through
                found.append(
                    {
                        "kind": "computation",
                        "pipeline": 0,
                        "stage": stage,
                        "gpu": gpu,
                        "iteration": iteration,
                        "start_s": 10.0 * iteration + stage + k,
                        "gpu_energy_j": energy_j + share * spent_j,
                    }
                )
            energy_j += spent_j
        return found

    trace = [
        *records("GPU-a", 0),
        *records("GPU-b", 1),
        {"kind": "window", "phase": "baseline", "first": 0, "last": 3},
        {"kind": "window", "phase": "optimized", "first": 3, "last": 6},
    ]
    found = exact_energy(trace)
    assert found is not None
    assert found["baseline_energy_per_iteration_j"] == pytest.approx(400.0)
    assert found["optimized_energy_per_iteration_j"] == pytest.approx(335.0)
    assert found["saving_pct"] == pytest.approx(16.25)
    unknown = [r | {"gpu_energy_j": None} if r.get("iteration") == 6 else r for r in trace]
    assert exact_energy(unknown) is None
    assert exact_energy(trace[:-1]) is None

"""The schedule registry: one entry per named schedule, the protocol's names, the rules each shape must
meet, torch's zero-bubble orders exactly, and the dependencies of a split backward."""

from __future__ import annotations

import io
import statistics
from typing import Any, get_args

import pytest
from perseus_client.message import SPLIT_BACKWARD_SCHEDULES, Schedule
from torch.distributed.pipelining import schedules as torch_schedules

from perseusd.errors import PlanningError
from perseusd.planner.baselines import all_max
from perseusd.planner.bundled import bundled_profile
from perseusd.planner.dag import B, Computation, F, I, W, build_dag, from_stage_orders
from perseusd.planner.policy import PointSummary, Policy
from perseusd.planner.profile_csv import profile_to_csv, read_profile_stream
from perseusd.planner.schedule_orders import interleaved_zero_bubble_order, zbv_order
from perseusd.planner.schedules import NAMES, OBSERVED, SCHEDULES, WIRE_NAMES, model_stage, spec_of
from perseusd.planner.solver import SolverParams, solve_frontier

LETTERS = {"F": F, "I": I, "W": W, "B": B}


def test_the_registry_holds_every_schedule_the_protocol_names() -> None:
    assert set(NAMES) | {OBSERVED} == set(get_args(Schedule)) == set(WIRE_NAMES)
    assert {name for name, spec in SCHEDULES.items() if spec.split_backward} == SPLIT_BACKWARD_SCHEDULES


@pytest.mark.parametrize("name", NAMES)
def test_every_named_schedule_builds_a_complete_deadlock_free_dag(name: str) -> None:
    spec = spec_of(name)
    built = 0
    for stages in range(1, 6):
        for microbatches in range(1, 11):
            for chunks in range(1, 4):
                if spec.problem(stages, microbatches, chunks) is not None:
                    with pytest.raises(PlanningError):
                        build_dag(name, stages, microbatches, chunks)
                    continue
                dag = build_dag(name, stages, microbatches, chunks)
                per_microbatch = len(spec.instructions) * chunks * stages
                assert dag.num_computations == per_microbatch * microbatches
                assert len(dag.topological_order) == dag.num_computations
                built += 1
    assert built > 20


@pytest.mark.parametrize(
    ("name", "stages", "microbatches", "chunks", "problem"),
    [
        ("1f1b", 4, 8, 2, "1F1B runs one chunk per stage"),
        ("gpipe", 4, 8, 2, "GPipe runs one chunk per stage"),
        ("interleaved", 4, 6, 2, "multiple of stages"),
        ("interleaved_zb", 4, 9, 2, "multiple of its rounds"),
        ("zbv", 4, 8, 1, "zero bubble V runs 2 chunks per stage"),
        ("zbv", 4, 8, 3, "zero bubble V runs 2 chunks per stage"),
    ],
)
def test_a_shape_a_schedule_cannot_run_is_refused_with_its_rule(
    name: str, stages: int, microbatches: int, chunks: int, problem: str
) -> None:
    with pytest.raises(PlanningError, match=problem):
        build_dag(name, stages, microbatches, chunks)
    assert problem in (spec_of(name).problem(stages, microbatches, chunks) or "")


def test_an_unknown_schedule_names_the_known_ones() -> None:
    with pytest.raises(PlanningError, match="expected 1f1b, gpipe, interleaved, interleaved_zb, zbv"):
        build_dag("zigzag", 2, 2)


def torch_order(
    cls: Any, stages: int, microbatches: int, chunks: int, rank: int
) -> list[tuple[Any, int, int]]:
    """torch's own per-rank action list (None slots dropped), chunk = the local stage's index."""
    schedule = cls.__new__(cls)  # the order is pure arithmetic on these fields: no process group needed
    schedule.pp_group_size, schedule.n_local_stages = stages, chunks
    schedule._n_microbatches, schedule.rank, schedule.num_stages = microbatches, rank, stages * chunks
    schedule.number_of_rounds = max(1, microbatches // stages)
    schedule.microbatches_per_round = microbatches // schedule.number_of_rounds
    steps = []
    for action in schedule._calculate_single_rank_operations(rank):
        if action is not None:
            local = sorted(
                {rank, stages * chunks - 1 - rank} if chunks == 2 and "ZBV" in cls.__name__ else ()
            )
            chunk = local.index(action.stage_index) if local else action.stage_index // stages
            steps.append((LETTERS[action.computation_type.value], action.microbatch_index, chunk))
    return steps


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
def test_interleaved_zero_bubble_runs_torchs_order(stages: int) -> None:
    cls = torch_schedules.ScheduleInterleavedZeroBubble
    for chunks in (1, 2, 3):
        for microbatches in range(1, 13):
            if spec_of("interleaved_zb").problem(stages, microbatches, chunks) is not None:
                continue
            for rank in range(stages):
                ours = interleaved_zero_bubble_order(stages, microbatches, chunks, rank)
                assert ours == torch_order(cls, stages, microbatches, chunks, rank)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
def test_zbv_runs_torchs_order(stages: int) -> None:
    for microbatches in range(1, 13):
        for rank in range(stages):
            ours = zbv_order(stages, microbatches, rank)
            assert ours == torch_order(torch_schedules.ScheduleZBVZeroBubble, stages, microbatches, 2, rank)


def test_a_split_backward_waits_as_the_data_flows() -> None:
    """F(v) -> F(v+1), I(v+1) -> I(v), I(v) -> W(v) on its own stage, and nothing else waits for a W."""
    dag = build_dag("interleaved_zb", 3, 6, 2)
    index = {c: n for n, c in enumerate(dag.computations)}
    for node, comp in enumerate(dag.computations):
        others = [
            dag.computations[p] for p in dag.predecessors[node] if dag.computations[p].stage != comp.stage
        ]
        v = comp.chunk * 3 + comp.stage
        if comp.instruction is W:
            assert index[Computation(comp.stage, I, comp.microbatch, comp.chunk)] in dag.predecessors[node]
            assert not others
            assert all(dag.computations[s].stage == comp.stage for s in dag.successors[node])
        elif comp.instruction is I and v < 5:
            assert Computation((v + 1) % 3, I, comp.microbatch, (v + 1) // 3) in others
        elif comp.instruction is F and v > 0:
            assert Computation((v - 1) % 3, F, comp.microbatch, (v - 1) // 3) in others


def test_the_v_layout_sends_chunk_zero_down_and_chunk_one_back_up() -> None:
    assert [model_stage("v", 4, s, 0) for s in range(4)] == [0, 1, 2, 3]
    assert [model_stage("v", 4, s, 1) for s in range(4)] == [7, 6, 5, 4]
    dag = build_dag("zbv", 4, 8, 2)
    index = {c: n for n, c in enumerate(dag.computations)}
    # the last stage turns the V: its chunk 0's forward feeds its own chunk 1, stage 0's chunk 1 ends it
    assert index[Computation(3, F, 2, 1)] in dag.successors[index[Computation(3, F, 2, 0)]]
    assert index[Computation(1, F, 2, 1)] in dag.successors[index[Computation(2, F, 2, 1)]]
    assert index[Computation(1, I, 2, 1)] in dag.successors[index[Computation(0, I, 2, 1)]]
    assert index[Computation(3, I, 2, 0)] in dag.successors[index[Computation(3, I, 2, 1)]]


def test_a_weight_gradient_before_its_input_gradient_is_refused() -> None:
    with pytest.raises(PlanningError, match="runs before its input gradient"):
        from_stage_orders([[(F, 0, 0), (W, 0, 0), (I, 0, 0)]], 1)


@pytest.mark.parametrize("board", ["a100_sxm", "a40"])
def test_the_weight_gradients_run_at_lower_clocks_than_the_input_gradients(board: str) -> None:
    """Nothing waits for a weight gradient but the iteration's end: at the default policy's point (the least
    energy no slower than all-max) each stage runs its W at most as fast as its I, and slower overall."""
    profile = bundled_profile(board).with_split_backward()
    dag = build_dag("interleaved_zb", 4, 8)
    points = list(solve_frontier(dag, profile, SolverParams()))
    summaries = [PointSummary(i, p.time_s, p.refined_energy_j) for i, p in enumerate(points)]
    chosen = points[Policy().choose(summaries, all_max(dag, profile, 0.0).time_s).index]
    clocks: dict[tuple[Any, int], list[int]] = {}
    for node, comp in enumerate(dag.computations):
        clocks.setdefault((comp.instruction, comp.stage), []).append(chosen.clocks_mhz[node])
    mean_w = [statistics.mean(clocks[W, s]) for s in range(4)]
    mean_i = [statistics.mean(clocks[I, s]) for s in range(4)]
    assert all(w <= i for w, i in zip(mean_w, mean_i, strict=True)), (mean_w, mean_i)
    assert sum(mean_w) < sum(mean_i)


def test_a_profile_gets_the_halves_of_the_backwards_it_did_not_measure() -> None:
    profile = bundled_profile("a100_sxm")
    split = profile.with_split_backward(0.4)
    whole = profile.lookup(2, B, 1410)
    assert split.lookup(2, I, 1410).time_s == pytest.approx(0.4 * whole.time_s)
    assert split.lookup(2, W, 1410).energy_j == pytest.approx(0.6 * whole.energy_j)
    assert split.with_split_backward() is split  # measured halves are kept as they are
    assert read_profile_stream(io.StringIO(profile_to_csv(split)), "split").digest() == split.digest()

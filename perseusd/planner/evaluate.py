"""Evaluate a frequency assignment on a DAG with measured values: iteration time and energy.

Iteration time T is the longest path through the DAG. Iteration energy is the energy of every computation
plus the blocking power of each GPU while it is not computing: E = sum_i e_i + P_block * (S * T - sum_i t_i).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from perseusd.planner.compiled import load_core
from perseusd.planner.dag import ComputationDag
from perseusd.planner.profile import Measurement, Profile


@dataclass(frozen=True)
class Evaluation:
    """Measured time and energy of one iteration under one frequency assignment."""

    time_s: float
    energy_j: float
    compute_energy_j: float
    blocking_energy_j: float


def longest_path_s(dag: ComputationDag, durations_s: Sequence[float]) -> float:
    """The iteration time: the longest path through `dag` with `durations_s[node]` per node."""
    finish = [0.0] * dag.num_computations
    for node in dag.topological_order:
        start = max((finish[p] for p in dag.predecessors[node]), default=0.0)
        finish[node] = start + durations_s[node]
    return max(finish, default=0.0)


SWITCHCORE = load_core("_switchcore")
"""The C module `_switchcore` (its `Paths` serves `LongestPath`, its `Core` `switch_core`), or None where it
was not built (or built from other sources: `compiled.load_core`)."""
_C_PATHS = None if SWITCHCORE is None else SWITCHCORE.Paths


def dag_arrays(dag: ComputationDag) -> tuple[array[int], array[int], array[int]]:
    """The DAG as (pred_ptr, pred_idx, topological order): predecessors of node v are
    pred_idx[pred_ptr[v]:pred_ptr[v + 1]]."""
    pred_ptr, pred_idx = array("q", [0]), array("q")
    for preds in dag.predecessors:
        pred_idx.extend(preds)
        pred_ptr.append(len(pred_idx))
    return pred_ptr, pred_idx, array("q", dag.topological_order)


def stage_ptr_of(dag: ComputationDag) -> array[int]:
    """Where each stage's nodes begin (and the last ends): stage s is nodes stage_ptr[s] to stage_ptr[s + 1].
    Raises ValueError unless the nodes are numbered stage by stage in schedule order (as `from_stage_orders`
    numbers them), which the C cores' stage loops assume."""
    stage_ptr = array("q", [0])
    for ids in dag.stage_orders:
        if list(ids) != list(range(stage_ptr[-1], stage_ptr[-1] + len(ids))):
            raise ValueError("the DAG's nodes are not numbered stage by stage in schedule order")
        stage_ptr.append(stage_ptr[-1] + len(ids))
    return stage_ptr


class LongestPath:
    """`longest_path_s` through one DAG for many sets of durations, in C where it was built (the same
    result: a maximum of sums taken in the same order)."""

    def __init__(self, dag: ComputationDag, use_c: bool = True) -> None:
        self.dag = dag
        self._c = _C_PATHS(*dag_arrays(dag)) if use_c and _C_PATHS is not None else None

    def __call__(self, durations_s: Sequence[float]) -> float:
        if self._c is not None:
            result: float = self._c.longest(durations_s)
            return result
        return longest_path_s(self.dag, durations_s)


def measurements_for(dag: ComputationDag, profile: Profile, clocks_mhz: Sequence[int]) -> list[Measurement]:
    """The measurement behind each node at its assigned clock (profile stage = the node's virtual stage)."""
    return [
        profile.lookup(dag.virtual_stage(node), comp.instruction, clocks_mhz[node])
        for node, comp in enumerate(dag.computations)
    ]


def evaluate_measurements(dag: ComputationDag, chosen: Sequence[Measurement], p_block_w: float) -> Evaluation:
    """Time and energy when node i runs as measured in `chosen[i]`."""
    time_s = longest_path_s(dag, [m.time_s for m in chosen])
    compute_j = sum(m.energy_j for m in chosen)
    idle_s = dag.num_stages * time_s - sum(m.time_s for m in chosen)
    blocking_j = p_block_w * idle_s
    return Evaluation(time_s, compute_j + blocking_j, compute_j, blocking_j)


def stage_energies_j(
    dag: ComputationDag, chosen: Sequence[Measurement], p_block_w: float, time_s: float
) -> list[float]:
    """Each GPU stage's energy in an iteration of `time_s` when node i runs as `chosen[i]`: its computations
    plus its blocking power while it is not computing (the terms of `evaluate_measurements`, per stage)."""
    energies = []
    for nodes in dag.stage_orders:
        busy_s = sum(chosen[n].time_s for n in nodes)
        energies.append(sum(chosen[n].energy_j for n in nodes) + p_block_w * max(0.0, time_s - busy_s))
    return energies


def evaluate_clocks(
    dag: ComputationDag, profile: Profile, clocks_mhz: Sequence[int], p_block_w: float
) -> Evaluation:
    """Time and energy of an iteration in which node i runs at `clocks_mhz[i]`."""
    return evaluate_measurements(dag, measurements_for(dag, profile, clocks_mhz), p_block_w)


def all_max_clocks(dag: ComputationDag, profile: Profile) -> list[int]:
    """Every computation at the highest clock measured for it."""
    return [profile.max_freq_mhz(dag.virtual_stage(n), c.instruction) for n, c in enumerate(dag.computations)]

"""Run the reference solver `lowtime==0.3.0` on the same input as ours (a development-only peer).

Used by the differential tests and the solver benchmark. It drives lowtime through its public API with
the parameters of the solver specification (option filter with the 0.95 fallback, effective cost after the
filter, exponential model keeping the lowest-error fit); nothing of lowtime is copied into the product.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from perseusd.planner.baselines import CandidatePoint
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.profile import Profile


def _spec(
    profile: Profile, stage: int, instruction: Instruction, unit_time_s: float, p_block_w: float
) -> Any:
    from lowtime.cost_model import ExponentialModel
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec

    rows = profile.options(stage, instruction)
    raw = [
        ExecutionOption(real_time=m.time_s, unit_time=unit_time_s, cost=m.energy_j, knob=m.freq_mhz)
        for m in rows
    ]
    candidates = CandidateExecutionOptions(options=raw)
    if len(candidates.options) <= 3:
        candidates = CandidateExecutionOptions(options=raw, noise_factor=0.95)
    effective = [
        ExecutionOption(
            real_time=o.real_time,
            unit_time=unit_time_s,
            cost=o.cost - p_block_w * o.quant_time * unit_time_s,
            knob=o.knob,
        )
        for o in candidates.options
    ]
    candidates = CandidateExecutionOptions(options=effective)
    return OperationSpec(options=candidates, cost_model=ExponentialModel(candidates, search_strategy="best"))


def lowtime_frontier(
    dag: ComputationDag, profile: Profile, unit_time_s: float, p_block_w: float
) -> Iterator[CandidatePoint]:
    """Generate lowtime's frontier for `dag` (emission order): each point's quantised time (s), its energy by
    lowtime's cost model plus the blocking energy, and its per-node clocks (our DAG's node ids)."""
    import networkx as nx
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import Operation
    from lowtime.solver import PhillipsDessouky

    specs: dict[tuple[int, Instruction], Any] = {}
    graph = nx.DiGraph()
    ops = []
    for node, comp in enumerate(dag.computations):
        key = (dag.virtual_stage(node), comp.instruction)
        if key not in specs:
            specs[key] = _spec(profile, key[0], key[1], unit_time_s, p_block_w)
        op = Operation(spec=specs[key])
        ops.append(op)
        graph.add_node(node, op=op)
    for node, succs in enumerate(dag.successors):
        for succ in succs:
            graph.add_edge(node, succ)
    source, sink = dag.num_computations, dag.num_computations + 1
    add_source_node(graph, source)
    add_sink_node(graph, sink)
    graph.graph["source_node"] = source
    graph.graph["sink_node"] = sink
    for result in PhillipsDessouky(graph).run():
        time_s = result.quant_time * unit_time_s
        energy = result.cost + dag.num_stages * time_s * p_block_w
        yield CandidatePoint(time_s, energy, tuple(op.assigned_knob for op in ops))

"""Where a closed-loop run's slowdown comes from, read off a `perseus-emulate --trace` file; prints JSON.

For the baseline and the optimized window of one 1F1B run (pipeline 0): the mean iteration span (the first
begin to the last end over every stage), the pipeline DAG's longest path with each computation's measured
duration and nothing between computations (`dag_s`: what the planner's model predicts from those
durations), and the time between computations measured two ways: `gap_ms`, from a computation's end to the
next one's begin on the same GPU when that one waited for nothing else, and `hop_ms`, from a computation's
end to the begin of the computation on the next stage that waited for it (an activation or a gradient
passed on). `replayed_s` replays the DAG with the measured durations, the baseline's `gap` on every edge
within a GPU and its `hop` on every edge between stages: it should come close to the span. The slowdowns
compare the optimized window with the baseline on each figure, so the share of the measured slowdown that
the durations explain (`dag`: the plan's clocks and how they were followed) and what the time between
stages adds (`replayed`) can be read apart. `exact_energy`: each window's energy per iteration and the saving
from the simulated GPUs' exact energy (`exact_energy`), which the counters' measurement approximates.

    python benchmarks/bench_closed_loop.py --cases a100x12 --trace-dir DIR
    python benchmarks/closed_loop_trace.py DIR/a100x12.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseusd.emulate.trace import read_trace
from perseusd.planner.dag import ComputationDag, build_dag

Record = dict[str, Any]


def _by_stage_iteration(records: Sequence[Record]) -> dict[tuple[int, int], list[Record]]:
    found: dict[tuple[int, int], list[Record]] = defaultdict(list)
    for record in records:
        if record.get("kind") == "computation" and record.get("pipeline", 0) == 0:
            found[(record["stage"], record["iteration"])].append(record)
    for computations in found.values():
        computations.sort(key=lambda r: r["start_s"])
    return found


def _node_records(dag: ComputationDag, found: dict[tuple[int, int], list[Record]], it: int) -> list[Record]:
    """The iteration's records by node id (each stage's records in its schedule order)."""
    nodes: list[Record] = [{}] * dag.num_computations
    for stage, order in enumerate(dag.stage_orders):
        for node, record in zip(order, found[(stage, it)], strict=True):
            nodes[node] = record
    return nodes


def _between(dag: ComputationDag, nodes: list[Record]) -> tuple[list[float], list[float]]:
    """(same-GPU gaps where the next computation waited for nothing else, hops to the next stage) in s."""
    stage_of = [c.stage for c in dag.computations]
    gaps: list[float] = []
    hops: list[float] = []
    for node, record in enumerate(nodes):
        same = [p for p in dag.predecessors[node] if stage_of[p] == stage_of[node]]
        other = [p for p in dag.predecessors[node] if stage_of[p] != stage_of[node]]
        previous_end_s = nodes[same[0]]["end_s"] if same else None
        sender_end_s = nodes[other[0]]["end_s"] if other else None
        if sender_end_s is not None and (previous_end_s is None or previous_end_s < sender_end_s):
            hops.append(record["start_s"] - sender_end_s)
        elif previous_end_s is not None and (sender_end_s is None or sender_end_s < previous_end_s):
            gaps.append(record["start_s"] - previous_end_s)
    return gaps, hops


def replay_s(dag: ComputationDag, durations_s: Sequence[float], gap_s: float, hop_s: float) -> float:
    """The DAG's longest path: each computation's duration, `gap_s` on each edge within a GPU and `hop_s` on
    each edge between stages."""
    stage_of = [c.stage for c in dag.computations]
    finish_s = [0.0] * dag.num_computations
    for node in dag.topological_order:
        start_s = max(
            (
                finish_s[p] + (gap_s if stage_of[p] == stage_of[node] else hop_s)
                for p in dag.predecessors[node]
            ),
            default=0.0,
        )
        finish_s[node] = start_s + durations_s[node]
    return max(finish_s, default=0.0)


def phase_figures(
    dag: ComputationDag, found: dict[tuple[int, int], list[Record]], span: range
) -> tuple[list[float], list[list[float]], float, float]:
    """One window's iteration spans, per-iteration durations by node id, median gap and median hop (s)."""
    spans: list[float] = []
    durations: list[list[float]] = []
    gaps: list[float] = []
    hops: list[float] = []
    for it in span:
        nodes = _node_records(dag, found, it)
        spans.append(max(r["end_s"] for r in nodes) - min(r["start_s"] for r in nodes))
        durations.append([r["end_s"] - r["start_s"] for r in nodes])
        it_gaps, it_hops = _between(dag, nodes)
        gaps += it_gaps
        hops += it_hops
    return spans, durations, statistics.median(gaps), statistics.median(hops)


def analyse(records: Sequence[Record]) -> dict[str, Any]:
    windows = {r["phase"]: range(r["first"], r["last"]) for r in records if r.get("kind") == "window"}
    if not {"baseline", "optimized"} <= set(windows):
        raise SystemExit("the trace has no baseline and optimized windows (did the run finish?)")
    found = _by_stage_iteration(records)
    stages = 1 + max(stage for stage, _ in found)
    microbatches = len(found[(0, windows["baseline"][0])]) // 2
    dag = build_dag("1f1b", stages, microbatches)
    base = phase_figures(dag, found, windows["baseline"])
    gap_s, hop_s = base[2], base[3]
    result: dict[str, Any] = {"stages": stages, "microbatches": microbatches}
    means: dict[str, dict[str, float]] = {}
    for phase, span in windows.items():
        spans, durations, phase_gap_s, phase_hop_s = phase_figures(dag, found, span)
        means[phase] = {
            "span_s": statistics.mean(spans),
            "dag_s": statistics.mean(replay_s(dag, d, 0.0, 0.0) for d in durations),
            "replayed_s": statistics.mean(replay_s(dag, d, gap_s, hop_s) for d in durations),
        }
        result[phase] = {k: round(v, 5) for k, v in means[phase].items()}
        result[phase] |= {"gap_ms": round(phase_gap_s * 1e3, 3), "hop_ms": round(phase_hop_s * 1e3, 3)}
    result["slowdown_pct"] = {
        figure.removesuffix("_s"): _pct(means["optimized"][figure], means["baseline"][figure])
        for figure in ("span_s", "dag_s", "replayed_s")
    }
    return result


def gpu_wrong_clock_fraction(records: Sequence[Record], plan: dict[str, Any]) -> float | None:
    """The share of pipeline 0's computations in the optimized window that began with another locked clock
    than `plan` (a `perseus-plan` document: `perseusctl plan --json`) names for them, by the simulated GPU's
    own clock at each computation's start (the board's truth, not the daemon's count: the daemon counts a
    begin late until the set call has returned, while the board's clock acts within the call). A
    computation the power cap held below its planned clock counts as right; one locked above it (a raise
    that stayed, a lowering not yet applied) is wrong whether or not the cap holds it. None: no optimized
    window in the trace."""
    window = next((r for r in records if r.get("kind") == "window" and r.get("phase") == "optimized"), None)
    if window is None:
        return None
    planned = {
        (stage, entry["instruction"], entry["microbatch"], entry["chunk"]): entry["freq_mhz"]
        for stage, entries in enumerate(plan["stages"])
        for entry in entries
    }
    begun = wrong = 0
    for record in records:
        if record.get("kind") != "computation" or record.get("pipeline", 0) != 0:
            continue
        if not window["first"] <= record["iteration"] <= window["last"]:
            continue
        key = (record["stage"], record["instruction"], record["microbatch"], record["chunk"])
        clock_mhz = record["clock_mhz"]
        planned_mhz = planned.get(key, clock_mhz)
        begun += 1
        wrong += clock_mhz != planned_mhz and not (record.get("capped") and clock_mhz < planned_mhz)
    return round(wrong / begun, 5) if begun else None


def exact_energy(records: Sequence[Record]) -> dict[str, Any] | None:
    """Each window's energy per iteration from the simulated GPUs' exact energy (no counter, no noise) and
    the saving it makes, beside what the counters measured: per GPU, its exact energy as it began its first
    computation of the window's first iteration and of its end iteration (each GPU at its own iteration
    boundary, so each counts whole iterations), summed over the GPUs and divided by the iterations. The
    counters' figure differs from it by where each window's samples fall in an iteration (a counter moves
    every 100 ms) and the counter's noise. None: a window, or a GPU's boundary, missing (an unfinished run,
    or an executor that does not know its GPU's energy)."""
    windows = {r["phase"]: (r["first"], r["last"]) for r in records if r.get("kind") == "window"}
    if not {"baseline", "optimized"} <= set(windows):
        return None
    first_begin: dict[tuple[Any, ...], tuple[float, float | None]] = {}  # (start s, GPU energy J)
    for record in records:
        if record.get("kind") != "computation":
            continue
        key = (record.get("pipeline", 0), record["stage"], record["gpu"], record["iteration"])
        if key not in first_begin or record["start_s"] < first_begin[key][0]:
            first_begin[key] = (record["start_s"], record.get("gpu_energy_j"))
    began_j = {key: energy_j for key, (_, energy_j) in first_begin.items()}
    gpus = sorted({key[:3] for key in first_begin})
    figures: dict[str, Any] = {}
    for phase in ("baseline", "optimized"):
        first, last = windows[phase]
        energies = [(began_j.get((*gpu, first)), began_j.get((*gpu, last))) for gpu in gpus]
        if any(start is None or end is None for start, end in energies):
            return None
        total_j = sum(end - start for start, end in energies if start is not None and end is not None)
        figures[f"{phase}_energy_per_iteration_j"] = round(total_j / (last - first), 3)
    saving = 1.0 - figures["optimized_energy_per_iteration_j"] / figures["baseline_energy_per_iteration_j"]
    figures["saving_pct"] = round(100.0 * saving, 3)
    return figures


def _pct(optimized: float, baseline: float) -> float:
    return round(100.0 * (optimized / baseline - 1.0), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trace", type=Path, help="a perseus-emulate --trace file of a finished run")
    args = parser.parse_args()
    records = read_trace(args.trace)
    print(json.dumps(analyse(records) | {"exact_energy": exact_energy(records)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

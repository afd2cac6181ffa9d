"""Helpers of the emulator's end-to-end tests: run the CLI, read its trace, recompute exact energies."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perseusd.emulate.topology import PipelineShape
from perseusd.planner.dag import Instruction

EMULATE_TIMEOUT_S = 120


def emulate_command(runtime_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "perseusd.emulate.main", "--runtime-dir", str(runtime_dir), *args]


def run_emulate(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        emulate_command(runtime_dir, *args),
        capture_output=True,
        text=True,
        timeout=EMULATE_TIMEOUT_S,
        check=False,
    )


def computations(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [record for record in records if record["kind"] == "computation"]


def exact_energy_j(
    runs: Iterable[Mapping[str, Any]], gpu: str, start_s: float, end_s: float, blocking_power_w: float
) -> float:
    """The simulated GPU's exact energy over [start_s, end_s]: its computations (pro rata) plus idle power."""
    busy_s = busy_j = 0.0
    for run in runs:
        if run["gpu"] != gpu:
            continue
        overlap_s = min(end_s, run["end_s"]) - max(start_s, run["start_s"])
        if overlap_s > 0:
            busy_s += overlap_s
            busy_j += run["energy_j"] * overlap_s / (run["end_s"] - run["start_s"])
    return busy_j + blocking_power_w * (end_s - start_s - busy_s)


def dependency_violations(runs: list[Mapping[str, Any]], shape: PipelineShape) -> list[str]:
    """Computations that started before the neighbour computation they wait for had ended."""
    ends = {
        (r["pipeline"], r["iteration"], r["stage"], r["instruction"], r["microbatch"], r["chunk"]): r["end_s"]
        for r in runs
    }
    problems = []
    for r in runs:
        source = shape.source(r["stage"], Instruction(r["instruction"]), r["chunk"])
        if source is None:
            continue
        key = (
            r["pipeline"],
            r["iteration"],
            source.gpu_stage,
            r["instruction"],
            r["microbatch"],
            source.chunk,
        )
        if key not in ends or r["start_s"] < ends[key]:
            problems.append(f"{r} started before {key} ended ({ends.get(key)})")
    return problems


def order_violations(runs: list[Mapping[str, Any]], shape: PipelineShape) -> list[str]:
    """Stages whose computations in an iteration did not run in the schedule's order."""
    by_stage: dict[tuple[int, int, int], list[Mapping[str, Any]]] = {}
    for r in runs:
        by_stage.setdefault((r["pipeline"], r["iteration"], r["stage"]), []).append(r)
    problems = []
    for (pipeline, iteration, stage), stage_runs in by_stage.items():
        ran = [
            (Instruction(r["instruction"]), r["microbatch"], r["chunk"])
            for r in sorted(stage_runs, key=lambda r: r["start_s"])
        ]
        if ran != shape.order(stage):
            problems.append(f"pipeline {pipeline} iteration {iteration} stage {stage}: {ran}")
    return problems

"""Run a worker script as WORLD rank processes (gloo over a file store) and collect their JSON reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

WORKER_TIMEOUT_S = 180.0
Reports = dict[str, list[dict[str, Any]]]
"""{case: per-rank reports}."""


@dataclass(frozen=True)
class CasesRun:
    """A daemon and what the ranks of every case reported against it."""

    daemon: DaemonProcess
    reports: Reports


@contextmanager
def cases_against_a_daemon(
    framework: str, world: int, cases: dict[str, dict[str, Any]], work: Path
) -> Iterator[CasesRun]:
    """A daemon of `world` simulated GPUs, and every case run by `world` ranks of `{framework}_worker.py`
    (beside this file) against it, one job per case named `{framework}-{case}`; the daemon stops on exit."""
    worker = Path(__file__).with_name(f"{framework}_worker.py")
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=world).start()
        where = {"runtime_dir": str(daemon.dirs.runtime_dir)}
        jobs = {name: {**case, **where, "job": f"{framework}-{name}"} for name, case in cases.items()}
        yield CasesRun(daemon, run_ranks(worker, world, jobs, work, WORKER_TIMEOUT_S))


def cases_run_fixture(framework: str, world: int, cases: dict[str, dict[str, Any]]) -> Any:
    """A framework test module's `cases_run` fixture: `cases_against_a_daemon` once for all its tests."""

    @pytest.fixture(scope="module")
    def cases_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CasesRun]:
        with cases_against_a_daemon(framework, world, cases, tmp_path_factory.mktemp(framework)) as run:
            yield run

    return cases_run


def assert_each_rank_found_its_gpu(reports: list[dict[str, Any]], daemon: DaemonProcess, world: int) -> None:
    """Each rank's integration found the GPU its launcher gave it, and registered."""
    node = [row["uuid"] for row in daemon.status()["gpus"]]
    assert [report["instrumented"]["gpu"] for report in reports] == launched_gpus(node, world)
    assert all(report["instrumented"]["register"][0] == "ok" for report in reports)


def run_ranks(
    worker: Path, world: int, cases: dict[str, dict[str, Any]], work: Path, timeout_s: float
) -> Reports:
    """Every case, one after the other in the same `world` processes: {case: per-rank reports}."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(worker.parent), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = remapped(world)  # as a launcher remaps: each rank finds its GPU's UUID
    procs = []
    for rank in range(world):
        out = work / f"rank{rank}.json"
        config = {"rank": rank, "world": world, "store": str(work / "store"), "cases": cases}
        command = [sys.executable, str(worker), json.dumps(config), str(out)]
        rank_env = {**env, "LOCAL_RANK": str(rank)}
        procs.append((subprocess.Popen(command, env=rank_env, stderr=subprocess.PIPE, text=True), out))
    errors = []
    try:
        for proc, _ in procs:
            _, err = proc.communicate(timeout=timeout_s)
            errors.append((proc.returncode, err))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for code, err in errors:
        assert code == 0, f"worker failed ({code}):\n{err[-4000:]}"
    per_rank = [json.loads(out.read_text()) for _, out in procs]
    return {name: [ranks[name] for ranks in per_rank] for name in cases}


def remapped(world: int) -> str:
    """The `CUDA_VISIBLE_DEVICES` the ranks run under: the node's GPUs from the last one down."""
    return ",".join(str(world - 1 - rank) for rank in range(world))


def launched_gpus(node: list[str], world: int) -> list[str]:
    """The GPU each rank was given under `remapped(world)`."""
    return [node[int(index)] for index in remapped(world).split(",")]


def split_steps(events: list[list[Any]], stage: int, steps: int) -> list[list[list[Any]]]:
    """Check step brackets and begin/end pairs on `stage`; each step's [instruction, mb, chunk] list."""
    result: list[list[list[Any]]] = []
    position = 0
    for number in range(steps):
        assert events[position] == ["step_begin", number]
        position += 1
        computations = []
        while events[position][0] == "comp_begin":
            begin, end = events[position], events[position + 1]
            assert end == ["comp_end", *begin[1:]]
            assert begin[1] == stage
            computations.append(begin[2:])
            position += 2
        assert events[position] == ["step_end", number]
        position += 1
        result.append(computations)
    assert position == len(events)  # nothing after training (the evaluation) was reported
    return result

"""The stage processes of one run: start them, talk to them, and make sure they are gone at the end.

Processes are spawned (not forked: the coordinator holds ZeroMQ sockets and threads). Each pipeline's stages
share their inboxes; every stage has a command queue; all report on one queue. With data-parallel sync, stage
s of every pipeline shares one barrier (the gradient all-reduce). Shutting down aborts the barriers (nobody
waits for a stage that is gone), asks nicely (SIGTERM: a stage releases its GPU and exits), then kills what
is left.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue as MpQueue
from multiprocessing.synchronize import Barrier
from typing import Any

from perseusd.emulate.messages import Command, Report
from perseusd.emulate.preflight import JobLayout
from perseusd.emulate.real_stage import RealStageSpec
from perseusd.emulate.stage_worker import StageQueues, StageSpec, stage_main
from perseusd.emulate.straggler import StragglerSpec

TERMINATE_GRACE_S = 10.0
"""How long stages get to release their GPUs after SIGTERM before they are killed."""


@dataclass(frozen=True)
class RunSettings:
    """What every stage of the run shares besides the layout."""

    job: str
    register_schedule: str
    time_scale: float
    trace_path: str | None
    dp_sync: bool = True
    """Stage s of every pipeline waits for the others at the end of each iteration (P > 1)."""
    straggler: StragglerSpec | None = None
    warmup_iterations: int = 1
    real: RealStageSpec | None = None
    """What the real stage (`JobLayout.real_stage`) computes when its GPU is real."""


class StageGroup:
    """All stage processes of a run, by pipeline and stage."""

    def __init__(self, layout: JobLayout, settings: RunSettings) -> None:
        context = multiprocessing.get_context("spawn")
        self.reports: MpQueue[Any] = context.Queue()
        self._commands: list[list[MpQueue[Any]]] = []
        self._inboxes: list[tuple[MpQueue[Any], ...]] = []  # a started Process drops its args: keep them
        self._processes: list[BaseProcess] = []
        sync = settings.dp_sync and layout.num_pipelines > 1
        self._barriers: list[Barrier] = (
            [context.Barrier(layout.num_pipelines) for _ in range(layout.shape.num_stages)] if sync else []
        )
        straggler = settings.straggler
        for pipeline, stages in enumerate(layout.stage_gpus):
            inboxes: tuple[MpQueue[Any], ...] = tuple(context.Queue() for _ in stages)
            self._inboxes.append(inboxes)
            commands: list[MpQueue[Any]] = []
            for stage, gpus in enumerate(stages):
                spec = StageSpec(
                    runtime_dir=str(layout.runtime_dir(pipeline, stage)),
                    sim_dir=str(layout.sim_dir(pipeline, stage)),
                    job=settings.job,
                    gpu=gpus[0],
                    peers=gpus[1:],
                    pipeline=pipeline,
                    stage=stage,
                    shape=layout.shape,
                    register_schedule=settings.register_schedule,
                    time_scale=settings.time_scale,
                    max_clock_mhz=layout.max_clock_mhz,
                    coordinator_pid=os.getpid(),
                    trace_path=settings.trace_path,
                    straggler=straggler if straggler and straggler.pipeline == pipeline else None,
                    warmup_iterations=settings.warmup_iterations,
                    profile=layout.profile,
                    real=settings.real if _is_real(layout, settings, pipeline, stage) else None,
                )
                commands.append(context.Queue())
                barrier = self._barriers[stage] if self._barriers else None
                queues = StageQueues(inboxes[stage], inboxes, commands[-1], self.reports, barrier)
                self._processes.append(
                    context.Process(
                        target=stage_main, args=(spec, queues), name=f"perseus-emulate-p{pipeline}s{stage}"
                    )
                )
            self._commands.append(commands)

    @property
    def size(self) -> int:
        return len(self._processes)

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def send_all(self, command: Command) -> None:
        """To every stage (e.g. "start")."""
        for commands in self._commands:
            for stage_commands in commands:
                stage_commands.put(command)

    def send_leaders(self, command: Command) -> None:
        """To each pipeline's first stage, which passes it down its pipeline at its next iteration start."""
        for commands in self._commands:
            commands[0].put(command)

    def next_reports(self, timeout_s: float) -> Iterator[Report]:
        """The reports waiting now, after waiting up to `timeout_s` for the first."""
        try:
            yield self.reports.get(timeout=timeout_s)
            while True:
                yield self.reports.get_nowait()
        except queue.Empty:
            return

    def exited_unexpectedly(self) -> list[str]:
        """Names of stage processes that died without reporting (killed, crashed)."""
        return [p.name for p in self._processes if p.exitcode not in (None, 0)]

    def all_exited(self) -> bool:
        return all(process.exitcode is not None for process in self._processes)

    def wait(self, timeout_s: float) -> bool:
        """Wait for every stage to exit; True when all did."""
        deadline_s = time.monotonic() + timeout_s
        for process in self._processes:
            process.join(max(0.0, deadline_s - time.monotonic()))
        return self.all_exited()

    def end_sync(self) -> None:
        """Abort the data-parallel barriers: a stage waiting there (or arriving later) trains on unsynced.

        Called when the stages are told to stop (pipelines may stop one iteration apart, and a stopped stage
        never reaches the barrier again) and at shutdown."""
        for barrier in self._barriers:
            barrier.abort()

    def shutdown(self) -> None:
        """Stop what still runs: SIGTERM (stages release their GPUs), then SIGKILL after a grace period."""
        self.end_sync()
        for process in self._processes:
            if process.exitcode is None and process.pid is not None:
                process.terminate()
        self.wait(TERMINATE_GRACE_S)
        for process in self._processes:
            if process.exitcode is None and process.pid is not None:
                process.kill()
                process.join(5.0)
        for commands in self._commands:
            for stage_commands in commands:
                stage_commands.cancel_join_thread()
        self.reports.cancel_join_thread()


def _is_real(layout: JobLayout, settings: RunSettings, pipeline: int, stage: int) -> bool:
    """Whether this stage runs real layers: the real stage, on a GPU that is not a simulated stand-in (or
    on the CPU beside one, `--real-device cpu`)."""
    on_cpu = settings.real is not None and settings.real.device == "cpu"
    return pipeline == 0 and stage == layout.real_stage and (not layout.real_simulated or on_cpu)

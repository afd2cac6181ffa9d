"""One emulated pipeline stage: a real OS process that trains on its own simulated GPU.

The stage claims its GPU through the real client library, locks it at its maximum clock (the baseline), and
runs its schedule's computations iteration after iteration: each waits for its neighbour's computation, runs
on its GPU (`executors`: the profile's time at the clock the daemon set on a simulated GPU, or real PyTorch
layers on a real one) wrapped in `client.computation`, and then frees the computation that waits for it. Each
iteration is a `client.step`.
The pipeline's first stage takes the coordinator's commands at iteration starts and passes them down the
pipeline with the iteration start, so every stage registers with the daemon (or stops) at the same iteration;
with an emulated straggler it also decides each iteration's throttle factor and passes it down the same way.
With data-parallel sync, a stage waits at the end of each iteration (after its last computation, inside the
step) until the same stage of every other pipeline got there: the gradient all-reduce.

A stage always releases its GPU on the way out: after a stop, an error, SIGINT/SIGTERM, or when its
coordinator dies (the kernel sends it SIGTERM then, and waits notice a changed parent).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.queues import Queue as MpQueue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import FrameType
from typing import Any

from perseus_client.client import PerseusClient, PerseusClientError

from perseusd.emulate.executors import StagePlace, open_executor
from perseusd.emulate.links import Inbox
from perseusd.emulate.messages import (
    Activation,
    Command,
    IterationBegan,
    IterationStart,
    Registered,
    StageDone,
    StageFailed,
    StageReady,
)
from perseusd.emulate.real_stage import RealStageSpec
from perseusd.emulate.straggler import HEALTHY, StragglerSpec, ThrottleSchedule
from perseusd.emulate.topology import PipelineShape
from perseusd.emulate.trace import TraceWriter
from perseusd.planner.dag import Instruction
from perseusd.planner.profile import Profile

CONTROL_TIMEOUT_S = 10.0
"""Control calls of a stage (claim, set_clock, register) are rare; a loaded machine may be slow to answer."""
DP_SYNC_TIMEOUT_S = 60.0
"""A stage that waits this long for the other pipelines at the gradient sync fails (one of them hangs)."""
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class StageSpec:
    """Everything one stage process needs (pickled to the process)."""

    runtime_dir: str
    sim_dir: str
    job: str
    gpu: str
    pipeline: int
    stage: int
    shape: PipelineShape
    register_schedule: str
    time_scale: float
    max_clock_mhz: int
    coordinator_pid: int
    trace_path: str | None = None
    straggler: StragglerSpec | None = None
    """Set on the stages of the straggler pipeline only."""
    warmup_iterations: int = 1
    profile: Profile | None = None
    """The job's per-clock costs, which the stage brings to its simulated GPU (None: the board's bundled)."""
    real: RealStageSpec | None = None
    """Set on the run's real stage only: its GPU is real and it runs real layers (`torch_stage`)."""
    peers: tuple[str, ...] = ()
    """The stage's other GPUs (tensor parallel): they run every computation with `gpu`, in step."""

    @property
    def gpus(self) -> tuple[str, ...]:
        return (self.gpu, *self.peers)


@dataclass(frozen=True)
class StageQueues:
    """The stage's inbox, the inboxes of its pipeline (by stage), its command queue, the report queue, and
    the barrier this stage index shares with the other pipelines (None: no data-parallel sync)."""

    inbox: MpQueue[Any]
    pipeline_inboxes: tuple[MpQueue[Any], ...]
    commands: MpQueue[Any]
    reports: MpQueue[Any]
    dp_barrier: Barrier | None = None


class DpSyncTimeoutError(Exception):
    """The other pipelines did not reach the gradient sync in time."""


class StageStoppedError(Exception):
    """SIGINT or SIGTERM arrived: stop training and release the GPU."""


def stage_main(spec: StageSpec, queues: StageQueues) -> None:
    """The stage process's entry point: train until told to stop; report failures instead of raising."""
    _install_stop_handlers()
    try:
        _die_with_coordinator(spec.coordinator_pid)
        with StageWorker(spec, queues) as worker:
            queues.reports.put(StageReady(spec.pipeline, spec.stage))
            if worker.wait_for_start():
                worker.train()
    except StageStoppedError:
        _abandon(queues)
    except Exception as exc:
        queues.reports.put(StageFailed(spec.pipeline, spec.stage, f"{type(exc).__name__}: {exc}"))
        _abandon(queues)
    queues.reports.put(StageDone(spec.pipeline, spec.stage))


class StageWorker:
    """A stage's GPU, client and inbox; `close` releases the GPU."""

    def __init__(self, spec: StageSpec, queues: StageQueues) -> None:
        self._spec = spec
        self._queues = queues
        self._inbox = Inbox(queues.inbox, lambda: os.getppid() == spec.coordinator_pid)
        self._order = spec.shape.order(spec.stage)
        self._pending: list[Command] = []
        straggler = spec.straggler
        self._throttle = ThrottleSchedule(
            straggler.factor if straggler else HEALTHY,
            spec.warmup_iterations,
            straggler.from_iterations if straggler else 0,
            straggler.to_iterations if straggler else None,
        )
        self._dp_barrier = queues.dp_barrier
        self._trace = TraceWriter(None if spec.trace_path is None else Path(spec.trace_path))
        place = StagePlace(
            first=spec.stage == 0,
            last=spec.stage == spec.shape.num_stages - 1,
            microbatches=spec.shape.num_microbatches,
        )
        with contextlib.ExitStack() as stack:
            self._executor = open_executor(spec.sim_dir, spec.gpu, spec.profile, spec.real, place, spec.peers)
            stack.callback(self._executor.close)
            if spec.real is not None:
                where = {"pipeline": spec.pipeline, "stage": spec.stage, "gpu": spec.gpu}
                self._trace.write([{"kind": "executor", **where, **self._executor.describe()}])
            self._client = stack.enter_context(
                PerseusClient(spec.runtime_dir, spec.job, timeout_s=CONTROL_TIMEOUT_S, strict=True)
            )
            self._client.claim(list(spec.gpus))
            for gpu in spec.gpus:
                self._client.set_clock(gpu, spec.max_clock_mhz)
            stack.pop_all()

    def __enter__(self) -> StageWorker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(PerseusClientError):
            self._client.release()
        self._client.close()
        self._executor.close()
        self._trace.close()

    @property
    def _leader(self) -> bool:
        return self._spec.stage == 0

    def wait_for_start(self) -> bool:
        """Wait for the coordinator's "start" (every stage gets one); False when told to stop instead."""
        while True:
            try:
                command: Command = self._queues.commands.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != self._spec.coordinator_pid:
                    return False
                continue
            return command.kind == "start"

    def train(self) -> None:
        """Run iterations until the pipeline's first stage passes on "stop"."""
        iteration = 0
        while True:
            start = self._begin_iteration(iteration)
            if start.command == "stop":
                return
            if start.command == "register":
                self._register()
            self._executor.throttle(start.throttle)
            self._run_iteration(iteration, start.throttle)
            iteration += 1

    def _begin_iteration(self, iteration: int) -> IterationStart:
        if self._leader:
            start_s = time.monotonic()
            command = self._next_command(iteration)
            if command == "register":
                self._throttle.registered(iteration)
            start = IterationStart(iteration, command, self._throttle.factor_at(iteration))
            self._queues.reports.put(IterationBegan(self._spec.pipeline, iteration, start_s, command))
        else:
            start = self._inbox.wait_iteration_start(iteration)
        if self._spec.stage + 1 < self._spec.shape.num_stages:
            self._queues.pipeline_inboxes[self._spec.stage + 1].put(start)
        return start

    def _next_command(self, iteration: int) -> str:
        """The coordinator's first command due at this iteration ("" when none is); "running" is taken in."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._pending.append(self._queues.commands.get_nowait())
        for command in [c for c in self._pending if c.kind == "running"]:
            self._throttle.running(command.after_iteration)
            self._pending.remove(command)
        for index, command in enumerate(self._pending):
            if iteration > command.after_iteration:
                del self._pending[index]
                return command.kind
        return ""

    def _register(self) -> None:
        spec, shape = self._spec, self._spec.shape
        for gpu in spec.gpus:
            self._client.set_clock(gpu, None)
        replies = [
            self._client.register(
                gpu,
                stage=spec.stage,
                num_stages=shape.num_stages,
                num_microbatches=shape.num_microbatches,
                schedule=spec.register_schedule,
                pipeline=spec.pipeline,
                chunks=shape.num_chunks,
                stage_gpus=len(spec.gpus),
            )
            for gpu in spec.gpus
        ]
        reply = replies[-1]
        assert reply is not None  # a strict client raises instead
        self._queues.reports.put(Registered(spec.pipeline, spec.stage, reply.state, reply.cached))

    def _run_iteration(self, iteration: int, throttle: float) -> None:
        spec, shape, client = self._spec, self._spec.shape, self._client
        records: list[dict[str, Any]] = []
        with contextlib.ExitStack() as step:
            for gpu in spec.gpus:
                step.enter_context(client.step(gpu, iteration))
            for instruction, microbatch, chunk in self._order:
                if shape.source(spec.stage, instruction, chunk) is not None:
                    with self._executor.waiting():
                        self._inbox.wait_activation(
                            Activation(iteration, instruction.value, microbatch, chunk)
                        )
                with contextlib.ExitStack() as computation:
                    for gpu in spec.gpus:
                        computation.enter_context(
                            client.computation(gpu, spec.stage, instruction.value, microbatch, chunk)
                        )
                    run = self._executor.run(
                        shape.profile_stage(spec.stage, chunk), instruction.value, microbatch, spec.time_scale
                    )
                self._activate(iteration, instruction, microbatch, chunk)
                if self._trace.enabled:
                    records.append(
                        {
                            "kind": "computation",
                            "pipeline": spec.pipeline,
                            "stage": spec.stage,
                            "gpu": spec.gpu,
                            "iteration": iteration,
                            "instruction": instruction.value,
                            "microbatch": microbatch,
                            "chunk": chunk,
                            "profile_stage": run.stage,
                            "clock_mhz": run.clock_mhz,
                            "clocks_mhz": list(getattr(self._executor, "last_clocks_mhz", (run.clock_mhz,))),
                            "ran_mhz": run.ran_mhz,
                            "capped": run.capped,
                            "throttle": throttle,
                            "start_s": run.start_s,
                            "end_s": run.start_s + run.duration_s,
                            "energy_j": run.energy_j,
                            "gpu_energy_j": run.gpu_energy_j,
                        }
                    )
            self._executor.iteration_done()
            self._sync()
        self._trace.write(records)

    def _sync(self) -> None:
        """Wait for the same stage of every other pipeline (the gradient all-reduce after the last backward).

        An aborted barrier means the run is stopping: train on without sync until the stop arrives."""
        if self._dp_barrier is None:
            return
        started_s = time.monotonic()
        try:
            self._dp_barrier.wait(DP_SYNC_TIMEOUT_S)
        except threading.BrokenBarrierError:
            if time.monotonic() - started_s >= DP_SYNC_TIMEOUT_S:
                raise DpSyncTimeoutError(
                    f"the other pipelines did not reach the gradient sync within {DP_SYNC_TIMEOUT_S:g} s"
                ) from None
            self._dp_barrier = None

    def _activate(self, iteration: int, instruction: Instruction, microbatch: int, chunk: int) -> None:
        """Free the computation on the neighbour that waits for this one."""
        destination = self._spec.shape.destination(self._spec.stage, instruction, chunk)
        if destination is not None:
            message = Activation(iteration, instruction.value, microbatch, destination.chunk)
            self._queues.pipeline_inboxes[destination.gpu_stage].put(message)


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise StageStoppedError(signal.Signals(signum).name)


def _install_stop_handlers() -> None:
    signal.signal(signal.SIGINT, _raise_stopped)
    signal.signal(signal.SIGTERM, _raise_stopped)


def _die_with_coordinator(coordinator_pid: int) -> None:
    """Ask the kernel for SIGTERM when the coordinator dies (even by SIGKILL), then check it still lives."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != coordinator_pid:
        raise StageStoppedError("the coordinator exited before this stage started")


def _abandon(queues: StageQueues) -> None:
    """After a failure nobody may read the neighbours' inboxes: do not wait at exit to flush them."""
    for inbox in queues.pipeline_inboxes:
        inbox.cancel_join_thread()

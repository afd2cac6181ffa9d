"""The torch.distributed.pipelining integration: real ranks (gloo, CPU) under each schedule against a real
daemon on simulated GPUs; the CUDA-event ordering logic with fake events; the real CUDA path on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.message import SPLIT_BACKWARD_SCHEDULES
from perseus_client.torch_events import CudaEventReporter, cuda_event_recorder
from perseus_client.torch_pipelining import instrument, schedule_name_of
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from perseusd.planner.dag import build_dag
from perseusd.planner.profile_csv import profile_to_csv
from tests.client.torch_pipelining_worker import RecordingClient
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.synthetic import synthetic_profile

pytestmark = pytest.mark.timeout(180)
WORKER = Path(__file__).with_name("torch_pipelining_worker.py")
WORKER_TIMEOUT_S = 120.0
STEPS = 3  # the worker's training steps
CASES = {
    "gpipe": {"schedule": "gpipe", "world": 2, "chunks": 1, "microbatches": 4},
    "1f1b": {"schedule": "1f1b", "world": 3, "chunks": 1, "microbatches": 4},
    "interleaved": {"schedule": "interleaved", "world": 2, "chunks": 2, "microbatches": 4},
    # zero bubble: split backwards reported as their two halves, registered by name (not learned)
    "interleaved_zb": {
        "schedule": "interleaved_zb",
        "world": 2,
        "chunks": 2,
        "microbatches": 4,
        "register_as": "interleaved_zb",
    },
    "zbv": {
        "schedule": "zbv",
        "world": 2,
        "chunks": 2,
        "microbatches": 4,
        "register_as": "zbv",
        "eval": False,
    },
}
NODE_GPUS = max(case["world"] for case in CASES.values())
if importlib.util.find_spec("torchtitan") is not None:  # the schedule torchtitan builds from its config
    CASES["torchtitan"] = {
        "schedule": "interleaved",
        "world": 2,
        "chunks": 2,
        "microbatches": 4,
        "torchtitan": "Interleaved1F1B",
    }
Run = tuple[dict[str, Any], list[dict[str, Any]]]


# ---------------------------------------------------------------------------------------- real ranks


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=NODE_GPUS).start()


@pytest.fixture(scope="module", params=list(CASES))
def run(
    request: pytest.FixtureRequest, daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    """Every rank of one schedule's case, run to completion: (case, per-rank reports)."""
    case = dict(CASES[request.param])
    work = tmp_path_factory.mktemp(f"torch-{request.param}")
    case.update(
        job=f"torch-{request.param}", runtime_dir=str(daemon.dirs.runtime_dir), store=str(work / "store")
    )
    split = case["schedule"] in SPLIT_BACKWARD_SCHEDULES
    case["profile"] = str(_write_profile(daemon, work, case["world"] * case["chunks"], split))
    return case, _run_ranks(case, work)


def _write_profile(daemon: DaemonProcess, work: Path, virtual_stages: int, split: bool) -> Path:
    """A synthetic profile on the sim GPU's clocks, so the daemon can plan without profiling online."""
    with PerseusClient(daemon.dirs.runtime_dir, job="clocks") as client:
        clocks_mhz = client.daemon_info.gpus[0].supported_sm_clocks_mhz[:10:9]  # type: ignore[union-attr]
    path = work / "profile.csv"
    profile = synthetic_profile(virtual_stages, seed=7, clocks_mhz=tuple(clocks_mhz))
    path.write_text(profile_to_csv(profile.with_split_backward() if split else profile))
    return path


def remapped(world: int) -> str:
    """The launcher's `CUDA_VISIBLE_DEVICES`: the node's GPUs from the last one down (rank r: GPU N-1-r)."""
    return ",".join(str(NODE_GPUS - 1 - rank) for rank in range(world))


def _run_ranks(case: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    env["CUDA_VISIBLE_DEVICES"] = remapped(case["world"])  # each rank names its GPU by UUID, by itself
    procs = []
    for rank in range(case["world"]):
        config = json.dumps({**case, "rank": rank})
        out = work / f"rank{rank}.json"
        command = [sys.executable, str(WORKER), config, str(out)]
        rank_env = {**env, "LOCAL_RANK": str(rank)}
        procs.append((subprocess.Popen(command, env=rank_env, stderr=subprocess.PIPE, text=True), out))
    try:
        for proc, _ in procs:
            _, err = proc.communicate(timeout=WORKER_TIMEOUT_S)
            assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err}"
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return [json.loads(out.read_text()) for _, out in procs]


def _expected_events(order: list[list[Any]], position: int) -> list[list[Any]]:
    """Each step brackets begin/end pairs of every computation, in the schedule's order."""
    events: list[list[Any]] = []
    for step in range(STEPS):
        events.append(["step_begin", step])
        for instruction, microbatch, chunk in order:
            events.append(["comp_begin", position, instruction, microbatch, chunk])
            events.append(["comp_end", position, instruction, microbatch, chunk])
        events.append(["step_end", step])
    return events


def test_training_identical_with_and_without_integration(run: Run) -> None:
    case, reports = run
    for report in reports:
        assert report["instrumented"]["params"] == report["baseline"]["params"]
        assert report["instrumented"]["losses"] == report["baseline"]["losses"]
    last_rank = 0 if case["schedule"] == "zbv" else -1  # the V's last model stage is on rank 0
    last = reports[last_rank]["baseline"]["losses"]
    assert [len(step) for step in last] == [case["microbatches"]] * STEPS
    assert sum(last[-1]) < sum(last[0])  # it did train


def _planned_orders(case: dict[str, Any]) -> list[list[list[Any]]]:
    """Each stage's order as perseusd plans the named schedule (torch's pipeline_order IR is off for 1F1B)."""
    dag = build_dag(case["schedule"], case["world"], case["microbatches"], case["chunks"])
    return [
        [[str(c.instruction), c.microbatch, c.chunk] for c in (dag.computations[node] for node in order)]
        for order in dag.stage_orders
    ]


def test_events_follow_the_schedule(run: Run) -> None:
    case, reports = run
    for rank, (order, report) in enumerate(zip(_planned_orders(case), reports, strict=True)):
        assert report["instrumented"]["events"] == _expected_events(order, rank)
        assert report["instrumented"]["events_dropped"] == 0


def test_schedule_named_after_its_class(run: Run) -> None:
    case, reports = run
    assert {report["instrumented"]["named"] for report in reports} == {case["schedule"]}


def test_each_rank_named_the_gpu_its_launcher_gave_it(run: Run, daemon: DaemonProcess) -> None:
    case, reports = run
    node = [row["uuid"] for row in daemon.status()["gpus"]]
    visible = [int(index) for index in remapped(case["world"]).split(",")]
    assert [report["instrumented"]["gpu"] for report in reports] == [node[index] for index in visible]


def test_daemon_learned_the_schedule(run: Run) -> None:
    case, reports = run
    rank0 = reports[0]["instrumented"]
    assert rank0["profile_import"][0] == "ok", rank0["profile_import"]
    assert [report["instrumented"]["register"][0] for report in reports] == ["ok"] * len(reports)
    status, stages = rank0["plan"]
    assert status == "ok", stages
    learned = [[[e["instruction"], e["microbatch"], e["chunk"]] for e in stage] for stage in stages]
    assert learned == _planned_orders(case)


# ---------------------------------------------------------------------------------------- in-process


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group: enough to build real schedules in this process."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _stages(count: int) -> list[PipelineStage]:
    return [PipelineStage(nn.Linear(4, 4), i, count, torch.device("cpu")) for i in range(count)]


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


@pytest.mark.usefixtures("one_rank")
def test_schedule_names() -> None:
    assert schedule_name_of(ScheduleGPipe(_stages(1)[0], 2, _loss)) == "gpipe"
    assert schedule_name_of(Schedule1F1B(_stages(1)[0], 2, _loss)) == "1f1b"
    uneven = ScheduleInterleaved1F1B(_stages(2), 3, _loss)
    assert schedule_name_of(uneven) == "interleaved"  # 3 microbatches, 1 rank
    for stage in uneven._stages:
        stage.group_size = 2  # as if on 2 ranks: torch then runs its flexible order, not Megatron-LM's
    assert schedule_name_of(uneven) == "observed"

    class Reordered(Schedule1F1B):
        pass

    assert schedule_name_of(Reordered(_stages(1)[0], 2, _loss)) == "observed"


@pytest.mark.usefixtures("one_rank")
def test_refused_registration_leaves_the_schedule_alone() -> None:
    schedule = ScheduleInterleaved1F1B(_stages(2), 4, _loss)
    client = RecordingClient(connect=False)
    with pytest.raises(PerseusClientError):
        instrument(schedule, client, "GPU-x", pipeline=3, stage_gpus=2, run="r7")
    fields = {"stage": 0, "num_stages": 1, "num_microbatches": 4, "schedule": "interleaved", "pipeline": 3}
    assert client.sent == [["register", {**fields, "chunks": 2, "stage_gpus": 2, "run": "r7"}]]
    assert "step" not in vars(schedule)


@pytest.mark.usefixtures("one_rank")
def test_instrument_reports_steps_with_chunks_and_close_restores() -> None:
    stages = _stages(2)
    schedule = ScheduleInterleaved1F1B(stages, 2, _loss)
    client = RecordingClient(connect=False)
    handle = instrument(schedule, client, "GPU-x", register=False, first_step=5)
    inputs, target = torch.randn(4, 4), torch.randn(4, 4)
    schedule.step(inputs, target=target)
    handle.close()
    schedule.step(inputs, target=target)  # after close: nothing more
    assert client.sent[0] == ["step_begin", 5]
    assert client.sent[-1] == ["step_end", 5]
    kinds = [event[0] for event in client.sent[1:-1]]
    begins = [tuple(event[1:]) for event in client.sent[1:-1:2]]
    ends = [tuple(event[1:]) for event in client.sent[2:-1:2]]
    expected = [(0, i, mb, chunk) for i in ("forward", "backward") for mb in (0, 1) for chunk in (0, 1)]
    assert kinds == ["comp_begin", "comp_end"] * len(expected)
    assert begins == ends
    assert sorted(begins) == sorted(expected)
    assert "step" not in vars(schedule)
    assert not any(
        name in vars(stage) for stage in stages for name in ("forward_one_chunk", "backward_one_chunk")
    )


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(("daemon_minor", "split"), [(8, True), (7, False)])
def test_a_zero_bubble_schedule_reports_both_halves_unless_the_daemon_predates_them(
    daemon_minor: int, split: bool
) -> None:
    schedule = ScheduleInterleavedZeroBubble(_stages(2), 2, _loss)
    client = RecordingClient(connect=False)
    client.protocol_minor = daemon_minor  # what the hello negotiated
    with pytest.raises(PerseusClientError):  # no daemon here: the registration is what was sent
        instrument(schedule, client, "GPU-x")
    assert client.sent[0][1]["schedule"] == ("interleaved_zb" if split else "observed")
    client.sent.clear()
    with instrument(schedule, client, "GPU-x", register=False):
        schedule.step(torch.randn(4, 4), target=torch.randn(4, 4))
    reported = {event[2] for event in client.sent if event[0] == "comp_begin"}
    halves = {"backward_input", "backward_weight"}
    assert reported == ({"forward", *halves} if split else {"forward", "backward"})


@pytest.mark.usefixtures("one_rank")
def test_eval_is_not_reported() -> None:
    schedule = ScheduleGPipe(_stages(1)[0], 2, _loss)
    client = RecordingClient(connect=False)
    with instrument(schedule, client, "GPU-x", register=False):
        inputs, target = torch.randn(4, 4), torch.randn(4, 4)
        with torch.no_grad():
            schedule.eval(inputs, target=target)
        schedule.step(inputs, target=target)
    assert [event[0] for event in client.sent] == ["step_begin"] + ["comp_begin", "comp_end"] * 4 + [
        "step_end"
    ]
    assert client.sent[0] == ["step_begin", 0]


# ---------------------------------------------------------------------------------------- CUDA path


class _FakeEvent:
    """Completes when the test says so, like a CUDA event the stream has not reached yet."""

    def __init__(self, fail: bool = False) -> None:
        self.done = threading.Event()
        self.waiting = threading.Event()
        self.fail = fail

    def synchronize(self) -> None:
        self.waiting.set()
        assert self.done.wait(30), "fake event never completed"
        if self.fail:
            raise RuntimeError("device lost")


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline_s = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline_s, what
        time.sleep(0.001)


def test_cuda_events_sent_in_recording_order_once_complete() -> None:
    events: list[_FakeEvent] = []

    def record() -> _FakeEvent:
        events.append(_FakeEvent())
        return events[-1]

    client = RecordingClient(connect=False)
    reporter = CudaEventReporter(client, "GPU-x", record)
    reporter.step_begin(0)
    reporter.computation_begin(1, "forward", 0, 0)
    reporter.computation_end(1, "forward", 0, 0)
    reporter.step_end(0)
    assert len(events) == 4  # recorded at once, on the training thread
    events[2].done.set()  # a later event completing first must wait for the earlier ones
    assert events[0].waiting.wait(10)
    assert client.sent == []  # the helper blocks on the first event, so nothing went out
    assert not events[2].waiting.is_set()
    events[0].done.set()
    _wait_until(lambda: len(client.sent) == 1, "first event not sent")
    events[1].done.set()
    _wait_until(lambda: len(client.sent) == 3, "events not sent in order")
    events[3].done.set()
    reporter.close()
    assert client.sent == [
        ["step_begin", 0],
        ["comp_begin", 1, "forward", 0, 0],
        ["comp_end", 1, "forward", 0, 0],
        ["step_end", 0],
    ]
    assert client.threads == {"perseus-cuda-events"}


def test_cuda_failures_drop_one_event_and_never_raise() -> None:
    outcomes = iter([_FakeEvent(fail=True), RuntimeError("no stream"), _FakeEvent()])

    def record() -> _FakeEvent:
        result = next(outcomes)
        if isinstance(result, Exception):
            raise result
        result.done.set()
        return result

    client = RecordingClient(connect=False)
    reporter = CudaEventReporter(client, "GPU-x", record)
    reporter.computation_begin(0, "backward", 1, 0)  # its wait fails
    reporter.computation_end(0, "backward", 1, 0)  # recording fails
    reporter.step_end(2)
    reporter.close()
    assert client.sent == [["step_end", 2]]
    assert reporter.failures == 2


def test_close_flushes_pending_events() -> None:
    event = _FakeEvent()
    client = RecordingClient(connect=False)
    reporter = CudaEventReporter(client, "GPU-x", lambda: event)
    reporter.step_begin(7)
    threading.Timer(0.05, event.done.set).start()
    reporter.close()
    assert client.sent == [["step_begin", 7]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_events_follow_the_stream() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    client = RecordingClient(connect=False)
    reporter = CudaEventReporter(client, "GPU-x", cuda_event_recorder(device))
    matrix = torch.randn(2048, 2048, device=device)
    for microbatch in range(4):
        reporter.computation_begin(0, "forward", microbatch, 0)
        for _ in range(20):
            matrix = torch.tanh(matrix @ matrix)
        reporter.computation_end(0, "forward", microbatch, 0)
    reporter.close()
    assert client.sent == [
        [kind, 0, "forward", mb, 0] for mb in range(4) for kind in ("comp_begin", "comp_end")
    ]
    assert client.threads == {"perseus-cuda-events"}
    assert torch.isfinite(matrix).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.usefixtures("one_rank")
def test_instrument_on_cuda_reports_from_the_event_thread() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    stage = PipelineStage(nn.Linear(4, 4).to(device), 0, 1, device)
    schedule = ScheduleGPipe(stage, 2, _loss)
    client = RecordingClient(connect=False)
    with instrument(schedule, client, "GPU-x", register=False):
        schedule.step(torch.randn(4, 4, device=device), target=torch.randn(4, 4, device=device))
    computations = [
        [kind, 0, i, mb, 0]
        for i in ("forward", "backward")
        for mb in (0, 1)
        for kind in ("comp_begin", "comp_end")
    ]
    assert client.sent == [["step_begin", 0], *computations, ["step_end", 0]]
    assert client.threads == {"perseus-cuda-events"}

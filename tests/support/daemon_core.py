"""A daemon core on simulated GPUs, without sockets, for unit tests of the core.

Assembled by the daemon's own composition function (`perseusd.daemon.main.daemon_core`), from a
configuration, over noise-free simulated GPUs of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from perseus_client.codes import JobState
from perseus_client.protocol import Claim, Hello, JobInfo, JobsReply, JobsRequest, ProfileImport, Register

from perseusd.daemon.access import AccessPolicy
from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.ipc import IpcServer, IpcSettings
from perseusd.daemon.main import daemon_core
from perseusd.daemon.service import Service
from perseusd.gpu.owner import GpuOwner
from perseusd.gpu.registry import GpuRegistry
from perseusd.gpu.sim import SimBackend, SimDevice
from perseusd.jobs.carbon_steering import CarbonSteering
from perseusd.jobs.settings import JobSettings
from perseusd.leasing.identity import Caller
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.callers import ME
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

RUNNING_TIMEOUT_S = 60.0

STAGES, MICROBATCHES = 2, 4
"""The shape most core tests give the job they start (`start_synthetic_job`): stages of a pipeline, and its
microbatches."""


@contextmanager
def sim_core(
    tmp_path: Path,
    gpus: int,
    *,
    jobs: JobSettings | None = None,
    model: str = "a100_sxm",
    carbon: CarbonSteering | None = None,
) -> Iterator[DaemonCore]:
    """A `DaemonCore` over `gpus` simulated GPUs with started owner threads; everything stopped on exit.

    State file `tmp_path / "state.json"`, job cache `tmp_path / "jobs"`; `jobs` replaces the job settings the
    configuration gives (defaults), `carbon` the carbon steering. Admins are uid 0. Clocks are raised when a
    computation begins (no early raise), as the core's unit tests expect.
    """
    config = DaemonConfig(
        backend="sim",
        sim_gpus=gpus,
        sim_model=model,
        runtime_dir=tmp_path / "run",
        state_dir=tmp_path,
        clock_lead_ms=0.0,
    )
    backend = SimBackend(tmp_path / "sim", gpus=gpus, model=model, noise=0.0)
    owners = [GpuOwner(device) for device in backend.devices()]
    for owner in owners:
        owner.start()
    registry = GpuRegistry(owners, call_timeout_s=5.0)
    try:
        with daemon_core(
            config, registry, lambda caller: caller.uid == 0, settings=jobs, carbon=carbon
        ) as core:
            try:
                yield core
            finally:
                core.leases.close()
    finally:
        for owner in owners:
            owner.stop()
        backend.close()


def sim_core_fixture(gpus: int, *, jobs: JobSettings | None = None, claimed_by: str | None = None) -> Any:
    """A test module's `core` fixture: `sim_core` over `gpus` GPUs (and `jobs`), fresh for each test; with
    `claimed_by`, every GPU already claimed by `ME` for that job."""

    @pytest.fixture
    def core(tmp_path: Path) -> Iterator[DaemonCore]:
        with sim_core(tmp_path, gpus, jobs=jobs) as built:
            if claimed_by is not None:
                claim(built, ME, built.registry.uuids, claimed_by)
            yield built

    return core


def busy_owner(registry: GpuRegistry, gpu: str, delay_s: float) -> Future[int]:
    """Put `gpu`'s owner thread inside a clock set that lasts `delay_s` (a slow simulated call); returns the
    set's Future. The fault stays until the device's `clear_faults`."""
    device = registry._owner(gpu)._device
    assert isinstance(device, SimDevice)
    device.inject_fault("set_locked_sm_clock_mhz", "slow", delay_s=delay_s)
    setting = registry.submit_locked_sm_clock_mhz(gpu, 1200)
    time.sleep(0.05)  # the owner thread is in the slow call
    return setting


def claim(core: DaemonCore, caller: Caller, gpus: Sequence[str], job: str) -> None:
    """What a client does first: `caller` says hello as `job` and leases `gpus` for it."""
    core.handle(caller, Hello(job=job, client_version="test"))
    core.handle(caller, Claim(gpus=tuple(gpus), job=job))


def synthetic_job_profile(stages: int) -> Profile:
    """The profile `start_synthetic_job` imports for a job of `stages` stages: the synthetic A100 profile
    (seed 3)."""
    return synthetic_profile(stages, seed=3, clocks_mhz=A100_CLOCKS_MHZ)


def start_synthetic_job(core: DaemonCore, pipelines: int, stages: int, microbatches: int) -> None:
    """Job "train" of `ME` on every GPU of `core`: `synthetic_job_profile` imported, `pipelines` x `stages`
    1F1B pipelines of `microbatches` registered (GPU `pipeline * stages + stage`); returns once the job runs
    its plan."""
    claim(core, ME, core.registry.uuids, "train")
    csv = profile_to_csv(synthetic_job_profile(stages))
    core.handle(ME, ProfileImport("train", csv, "synthetic.csv", 80.0))
    for pipeline in range(pipelines):
        for stage in range(stages):
            gpu = core.registry.uuids[pipeline * stages + stage]
            core.handle(ME, Register(gpu, "train", pipeline, stage, stages, microbatches, "1f1b", 1))
    tick_until(core, lambda: core_job(core).state == JobState.RUNNING, RUNNING_TIMEOUT_S, "the job never ran")


def tick_until(
    core: DaemonCore, condition: Callable[[], bool], timeout_s: float = 60.0, failure: str = "timed out"
) -> None:
    """Tick `core` every 20 ms, as the daemon's loop would, until `condition` holds; the test fails with
    `failure` once `timeout_s` has passed without it."""
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, failure
        core.tick()
        time.sleep(0.02)


@contextmanager
def running_core(
    tmp_path: Path, pipelines: int, stages: int, microbatches: int, *, carbon: CarbonSteering | None = None
) -> Iterator[DaemonCore]:
    """`sim_core` over `pipelines * stages` GPUs with the default job settings (and `carbon`), job "train"
    running its plan (`start_synthetic_job`)."""
    with sim_core(tmp_path, gpus=pipelines * stages, jobs=JobSettings(), carbon=carbon) as core:
        start_synthetic_job(core, pipelines, stages, microbatches)
        yield core


def running_core_fixture(pipelines: int, stages: int, microbatches: int) -> Any:
    """A test module's `core` fixture: `running_core` of that shape, fresh for each test."""

    @pytest.fixture
    def core(tmp_path: Path) -> Iterator[DaemonCore]:
        with running_core(tmp_path, pipelines, stages, microbatches) as built:
            yield built

    return core


def core_jobs(core: DaemonCore) -> tuple[JobInfo, ...]:
    """The jobs `core` shows `ME` (a `jobs` request)."""
    reply = core.handle(ME, JobsRequest())
    assert isinstance(reply, JobsReply)
    return reply.jobs


def core_job(core: DaemonCore) -> JobInfo:
    """The first job `core` shows `ME`: in these tests, their one job."""
    return core_jobs(core)[0]


def leased_service(core: DaemonCore, tmp_path: Path) -> tuple[Service, IpcServer, str]:
    """The daemon's service loop over `core`, its sockets bound under `tmp_path / "run"` (closed by the
    caller: `ipc.close()`), and the core's first GPU, leased by this process."""
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir()
    config = DaemonConfig(backend="sim", runtime_dir=runtime_dir, state_dir=tmp_path)
    ipc = IpcServer(core, AccessPolicy("root", "root"), IpcSettings(runtime_dir, 1 << 20))
    ipc.bind()
    gpu = core.registry.uuids[0]
    claim(core, ME, (gpu,), "t")
    return Service(config, core, ipc, lambda: config, lambda _new: None), ipc, gpu


def on_replies(ipc: IpcServer, seen: Callable[[int], None]) -> None:
    """Call `seen(request_id)` as the daemon sends each reply (judging a request on the daemon's side: the
    reply's way back to a socket may take longer than a loop iteration on a loaded machine)."""
    requests = ipc._requests
    real_reply = requests._reply

    def reply(*args: Any) -> None:
        seen(args[2])
        real_reply(*args)

    requests._reply = reply  # type: ignore[method-assign]

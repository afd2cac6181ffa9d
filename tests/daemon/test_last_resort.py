"""The service loop's last resort: an iteration that fails is survived; a loop that keeps failing, or dies of
anything else, ends the daemon only after every GPU is restored."""

from __future__ import annotations

from pathlib import Path

import pytest
from perseus_client.protocol import SetClock

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.ipc import IpcServer
from perseusd.daemon.service import EXIT_CRASHED, MAX_LOOP_FAILURES, Service
from tests.support.callers import ME
from tests.support.daemon_core import leased_service, sim_core

pytestmark = pytest.mark.timeout(120)


def _locked_service(core: DaemonCore, tmp_path: Path) -> tuple[Service, IpcServer, str]:
    service, ipc, gpu = leased_service(core, tmp_path)
    core.handle(ME, SetClock(gpu=gpu, sm_clock_mhz=1200))
    assert core.registry.read_all()[gpu].locked_sm_clock_mhz == 1200
    core.busy = lambda: True  # type: ignore[method-assign]  # poll briefly: each iteration is quick
    return service, ipc, gpu


@pytest.mark.parametrize("error", [RuntimeError("broken tick"), KeyboardInterrupt(), MemoryError()])
def test_a_dying_loop_restores_every_gpu(tmp_path: Path, error: BaseException) -> None:
    with sim_core(tmp_path, gpus=2) as core:
        service, ipc, gpu = _locked_service(core, tmp_path)
        calls = []

        def tick() -> None:
            calls.append(1)
            raise error

        core.tick = tick  # type: ignore[method-assign]
        try:
            assert service.run() == EXIT_CRASHED
        finally:
            ipc.close()
        assert core.registry.read_all()[gpu].locked_sm_clock_mhz is None  # restored before the exit
        assert core.leases.session_count == 0
        expected_calls = MAX_LOOP_FAILURES if isinstance(error, Exception) else 1
        assert len(calls) == expected_calls  # an Exception is retried, anything else ends the loop at once


def test_one_failing_iteration_is_survived(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=1) as core:
        service, ipc, gpu = _locked_service(core, tmp_path)
        calls = []
        real_tick = core.tick

        def tick() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("once")
            if len(calls) == 3:
                service._signals.stop = True  # then stop as SIGTERM would
            real_tick()

        core.tick = tick  # type: ignore[method-assign]
        try:
            assert service.run() == 0
        finally:
            ipc.close()
        assert service.loop_errors == 1
        assert core.registry.read_all()[gpu].locked_sm_clock_mhz is None

"""The client library against the real daemon: events never block or raise; reconnect and re-register."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from perseus_client import PerseusClient, PerseusClientError

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def dirs() -> DaemonDirs:
    return DaemonDirs.create()


@pytest.fixture
def started() -> Iterator[list[DaemonProcess]]:
    with daemon_processes() as make:
        procs: list[DaemonProcess] = []
        yield procs
        for proc in procs:
            proc.kill()
        del make


def test_events_dropped_not_raised_while_daemon_down_then_reregistered(
    dirs: DaemonDirs, started: list[DaemonProcess]
) -> None:
    first = DaemonProcess(dirs, gpus=1)
    started.append(first.start())
    client = PerseusClient(dirs.runtime_dir, job="resilient", timeout_s=3.0, strict=True)
    try:
        uuid = client.daemon_info.gpus[0].uuid  # type: ignore[union-attr]
        client.claim([uuid])
        first.signal(signal.SIGKILL)
        first.wait()
        time.sleep(0.2)
        dropped_before = client.events_dropped
        began_s = time.perf_counter()
        for microbatch in range(1000):
            with client.computation(uuid, 0, "forward", microbatch):
                pass
        elapsed_s = time.perf_counter() - began_s
        assert client.events_dropped - dropped_before == 2000
        assert elapsed_s < 5.0  # never blocked (a blocked send waits for good)
        with pytest.raises(PerseusClientError) as info:
            client.status()
        assert info.value.code == "UNREACHABLE"
        second = DaemonProcess(dirs, gpus=1)
        started.append(second.start())
        deadline_s = time.monotonic() + 10
        while client.reconnects < 1:
            assert time.monotonic() < deadline_s, "client did not re-register"
            time.sleep(0.02)
        row = second.status()["gpus"][0]  # type: ignore[index]
        assert row["lease"]["job"] == "resilient"  # re-claimed after the restart
        sent = client.events_sent
        while (
            client.events_sent < sent + 2
        ):  # the event socket reconnects on its own, within ZeroMQ's interval
            assert time.monotonic() < deadline_s, "events never flowed again"
            with client.computation(uuid, 0, "forward", 0):
                pass
            time.sleep(0.02)
    finally:
        client.close()


def test_control_call_without_daemon_raises_typed_error(dirs: DaemonDirs) -> None:
    began_s = time.monotonic()
    with pytest.raises(PerseusClientError) as info:
        PerseusClient(dirs.runtime_dir, timeout_s=0.3, strict=True)
    assert info.value.code == "UNREACHABLE"
    assert time.monotonic() - began_s < 3.0


def test_bad_instruction_is_dropped_not_raised(dirs: DaemonDirs) -> None:
    client = PerseusClient(dirs.runtime_dir, connect=False)
    client.computation_begin("GPU-x", 0, "sideways", 0)
    client.step_begin("GPU-x", 1)  # not connected: dropped
    assert client.events_dropped == 2
    assert client.events_sent == 0

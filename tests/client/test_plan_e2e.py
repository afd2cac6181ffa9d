"""Per-computation clock switching against a real daemon on sim GPUs: the sim GPU's clock follows the plan."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from perseus_client import PerseusClient, PerseusClientError, PlanEntry

from perseusd.workload.sim_workload import SimGpuHandle
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, client_outcome, daemon_processes

pytestmark = pytest.mark.timeout(60)
MICROBATCHES = 6


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=1).start()


def _wait_clock(handle: SimGpuHandle, clock_mhz: int, timeout_s: float = 2.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while handle.current_clock_mhz() != clock_mhz:
        assert time.monotonic() < deadline_s, f"clock {handle.current_clock_mhz()} never became {clock_mhz}"
        time.sleep(0.0005)


def test_clock_follows_plan_and_plan_dropped_on_release(daemon: DaemonProcess) -> None:
    runtime_dir = daemon.dirs.runtime_dir
    with PerseusClient(runtime_dir, job="plan", timeout_s=10.0, strict=True) as client:
        info = client.daemon_info.gpus[0]  # type: ignore[union-attr]
        high, low = info.supported_sm_clocks_mhz[0], info.supported_sm_clocks_mhz[30]
        with pytest.raises(PerseusClientError) as refused:
            client.set_plan(info.uuid, [PlanEntry("forward", 0, 0, high)])
        assert refused.value.code == "NOT_LEASED"
        client.claim([info.uuid])
        plan = [PlanEntry("forward", mb, 0, high if mb % 2 == 0 else low) for mb in range(MICROBATCHES)]
        assert client.set_plan(info.uuid, plan) == MICROBATCHES
        handle = SimGpuHandle.open(runtime_dir / "sim", info.uuid)
        try:
            _wait_clock(handle, high)
            seen = []
            for entry in plan:
                _wait_clock(handle, entry.freq_mhz)  # applied before the computation begins
                seen.append(handle.current_clock_mhz())
                client.computation_begin(info.uuid, 0, "forward", entry.microbatch)
                client.computation_end(info.uuid, 0, "forward", entry.microbatch)
            _wait_clock(handle, high)  # wrapped around to the first computation
        finally:
            handle.close()
        assert seen == [entry.freq_mhz for entry in plan]
        row = daemon.status()["gpus"][0]
        assert row["plan"]["computations"] == MICROBATCHES
        assert row["plan"]["clock_changes"] == MICROBATCHES + 1
        assert row["plan"]["errors"] == 0
        assert row["plan"]["event_to_clock_p99_ms"] is not None
        assert row["locked_clock_mhz"] == high
        client.release([info.uuid])
        assert daemon.status()["gpus"][0]["plan"] is None


def test_malformed_plans_refused(daemon: DaemonProcess) -> None:
    def attempt(plan: list[dict[str, object]]) -> str:
        def action(client: PerseusClient) -> int:
            uuid = client.daemon_info.gpus[0].uuid  # type: ignore[union-attr]
            client.claim([uuid])
            return client.set_plan(uuid, plan)  # type: ignore[arg-type]

        code, _ = client_outcome(daemon.dirs.runtime_dir, action)
        return str(code)

    good = {"instruction": "forward", "microbatch": 0, "chunk": 0, "freq_mhz": 1200}
    assert attempt([good]) == "ok"
    assert attempt([]) == "BAD_FIELD"
    assert attempt([{**good, "instruction": "sideways"}]) == "BAD_FIELD"
    assert attempt([{**good, "freq_mhz": "fast"}]) == "BAD_FIELD"
    assert attempt([good, good]) == "BAD_FIELD"
    assert attempt([{**good, "freq_mhz": 99_999}]) == "BAD_FIELD"
    huge = [{**good, "microbatch": i} for i in range(20_000)]  # > max_frame_bytes (1 MiB)
    assert attempt(huge) == "TOO_LARGE"
    assert daemon.proc is not None
    assert daemon.proc.poll() is None  # never crashes on input


def test_clear_plan_keeps_clock(daemon: DaemonProcess) -> None:
    with PerseusClient(daemon.dirs.runtime_dir, job="clear", timeout_s=10.0) as client:
        info = client.daemon_info.gpus[0]  # type: ignore[union-attr]
        client.claim([info.uuid])
        low = info.supported_sm_clocks_mhz[30]
        client.set_plan(info.uuid, [PlanEntry("backward", 0, 0, low)])
        assert client.clear_plan(info.uuid) is True
        row = daemon.status()["gpus"][0]
        assert row["plan"] is None
        assert row["locked_clock_mhz"] == low
        assert client.clear_plan(info.uuid) is False

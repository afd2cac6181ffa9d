"""Carried events against a real daemon on sim GPUs (protocol 6.11): the daemon says which events of a plan
may wait, the client sends them with the next one, and the daemon reads every one, in order, as before."""

from __future__ import annotations

import socket
import time

import pytest
from perseus_client import PerseusClient, PlanEntry
from perseus_client.envelope import SEQPACKET_EVENT_SOCKET_NAME

from perseusd.daemon.event_intake import MAX_FRAMES_PER_DATAGRAM
from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(90)
MICROBATCHES = 4
STEPS = 6


def _plan(high: int, low: int) -> list[PlanEntry]:
    forwards = [PlanEntry("forward", mb, 0, high) for mb in range(MICROBATCHES)]
    return forwards + [PlanEntry("backward", mb, 0, low) for mb in range(MICROBATCHES)]


def _train(client: PerseusClient, gpu: str, plan: list[PlanEntry]) -> None:
    for step in range(STEPS):
        client.step_begin(gpu, step)
        for entry in plan:
            client.computation_begin(gpu, 0, entry.instruction, entry.microbatch)
            client.computation_end(gpu, 0, entry.instruction, entry.microbatch)
        client.step_end(gpu, step)
        time.sleep(0.05)  # the daemon's carry frame arrives between steps


def _trained(client: PerseusClient) -> str:
    """Claim the daemon's first GPU, set the plan and train `STEPS` steps under it: the GPU's UUID."""
    info = client.daemon_info.gpus[0]  # type: ignore[union-attr]
    clocks = info.supported_sm_clocks_mhz
    plan = _plan(clocks[0], clocks[30])
    client.claim([info.uuid])
    client.set_plan(info.uuid, plan)
    _train(client, info.uuid, plan)
    return info.uuid


def _run(daemon: DaemonProcess) -> tuple[PerseusClient, dict[str, object]]:
    with PerseusClient(daemon.dirs.runtime_dir, job="carry", timeout_s=10.0, strict=True) as client:
        _trained(client)
        row = daemon.status()["gpus"][0]["plan"]
    return client, row


@pytest.mark.parametrize("carrying", [True, False])
def test_the_daemon_reads_every_carried_event_and_switches_as_before(carrying: bool) -> None:
    env = {} if carrying else {"PERSEUSD_CARRY_EVENTS": "false"}
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1, env=env).start()
        client, plan_row = _run(daemon)
        health = daemon.status()["daemon"]
    events = STEPS * (2 * 2 * MICROBATCHES + 2)
    assert client.events_sent == events
    assert client.events_dropped == client.events_lost == 0
    assert health["events_dropped"] == 0
    # Per step: begins after the first of each half (3 + 3) and ends before the last (3 + 3) may wait; the
    # first step goes before the carry frame is read.
    carried = client.events_carried
    assert (carried >= (STEPS - 2) * 12) if carrying else (carried == 0)
    assert plan_row["clock_changes"] == 2 * STEPS + 1  # lower after the forwards, raise after the backwards
    assert plan_row["unplanned"] == plan_row["errors"] == 0


def test_a_datagram_of_too_many_frames_is_dropped_and_the_daemon_serves_on() -> None:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(str(daemon.dirs.runtime_dir / SEQPACKET_EVENT_SOCKET_NAME))
            sock.send(b"\n" * MAX_FRAMES_PER_DATAGRAM)  # one more frame than allowed, each empty
            sock.send(b"\n\n")  # three empty frames: three refused
        finally:
            sock.close()
        deadline_s = time.monotonic() + 10
        while daemon.status()["daemon"]["events_received"] < 4:
            assert time.monotonic() < deadline_s
            time.sleep(0.05)
        health = daemon.status()["daemon"]
    assert health["events_received"] == health["events_dropped"] == 4
    assert health["errors_by_code"].get("TOO_LARGE") == 1


def test_frames_held_when_the_daemon_dies_are_dropped_and_counted_never_raised() -> None:
    with daemon_processes() as make:
        daemon = make(DaemonDirs.create(), gpus=1).start()
        client = PerseusClient(daemon.dirs.runtime_dir, job="carry-kill", timeout_s=5.0)
        gpu = _trained(client)
        client.step_begin(gpu, STEPS)
        client.computation_begin(gpu, 0, "forward", 0)
        client.computation_end(gpu, 0, "forward", 0)  # carried: held
        client.computation_begin(gpu, 0, "forward", 1)  # carried: held
        assert client.events_carried > 0
        daemon.kill()
        deadline_s = time.monotonic() + 10
        while client.managed:  # the client notices the daemon went away
            assert time.monotonic() < deadline_s
            time.sleep(0.01)
        client.computation_end(gpu, 0, "forward", 1)  # no session: dropped at once
        client.step_end(gpu, STEPS)
        client.close()  # never raises in fail-open mode
    assert client.events_dropped >= 4  # the two held frames and the two sent after
    assert client.events_sent + client.events_dropped == STEPS * (4 * MICROBATCHES + 2) + 6

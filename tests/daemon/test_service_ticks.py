"""The main loop's periodic work (`DaemonCore.tick`) is paced by the clock, not by a training job's events:
while only events arrive it runs at most every `TICK_PERIOD_S`, yet never later than that; anything else the
loop serves (a request here) is still followed by a tick at once. Real sockets, the real service loop."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq
from perseus_client.protocol import PROTOCOL_MAJOR, StatusRequest, encode

from perseusd.daemon import service as service_module
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.service import TICK_PERIOD_S, Service
from tests.support.daemon_core import leased_service, on_replies, sim_core
from tests.support.sockets import connected, zmq_context

pytestmark = pytest.mark.timeout(120)
WAIT_S = 60.0  # a bound on waiting for the loop to read, not a timing assertion


@contextmanager
def running_service(tmp_path: Path) -> Iterator[tuple[Service, DaemonCore, list[float], str]]:
    """A service over a sim core whose GPU this process leases; its ticks' times are recorded."""
    with sim_core(tmp_path, gpus=1) as core:
        service, ipc, gpu = leased_service(core, tmp_path)
        ticks: list[float] = []
        real_tick = core.tick

        def tick() -> None:
            ticks.append(time.monotonic())
            real_tick()

        core.tick = tick  # type: ignore[method-assign]
        try:
            yield service, core, ticks, gpu
        finally:
            ipc.close()


def event(gpu: str, microbatch: int, kind: str) -> bytes:
    body = {"gpu": gpu, "stage": 0, "instruction": "forward", "microbatch": microbatch, "chunk": 0}
    return json.dumps({"v": PROTOCOL_MAJOR, "id": 0, "type": kind, **body, "timestamp_ns": 1}).encode()


def serve_until(service: Service, done: Callable[[], bool], poll_s: float = 0.05) -> None:
    deadline_s = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline_s
        service._iterate(poll_s)


def send_and_serve(service: Service, core: DaemonCore, push: zmq.Socket[bytes], frame: bytes) -> None:
    """Send one event and run the loop until the daemon has read it (each poll waits for it: no timeout
    ends a poll, so every tick seen is one the events caused)."""
    received = core.tracker.received
    push.send(frame)
    serve_until(service, lambda: core.tracker.received > received, poll_s=WAIT_S)


def test_events_alone_tick_at_most_every_period(tmp_path: Path) -> None:
    with running_service(tmp_path) as (service, core, ticks, gpu):
        with zmq_context() as ctx:
            push = connected(ctx, zmq.PUSH, tmp_path / "run" / "events.sock")
            pairs = 150
            send_and_serve(service, core, push, event(gpu, 10_000, "comp_begin"))  # connected
            began_s = time.monotonic()
            ticks.clear()
            for microbatch in range(pairs):  # one event per wake-up, as training sends them
                for kind in ("comp_begin", "comp_end"):
                    send_and_serve(service, core, push, event(gpu, microbatch, kind))
            elapsed_s = time.monotonic() - began_s
        assert core.tracker.received == 2 * pairs + 1
        assert core.tracker.dropped == 0
        assert len(ticks) <= elapsed_s / TICK_PERIOD_S + 2  # not one per event (300 wake-ups)


def test_a_skipped_tick_runs_when_its_period_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    period_s = 3.0
    monkeypatch.setattr(service_module, "TICK_PERIOD_S", period_s)
    with running_service(tmp_path) as (service, core, ticks, gpu), zmq_context() as ctx:
        push = connected(ctx, zmq.PUSH, tmp_path / "run" / "events.sock")
        send_and_serve(service, core, push, event(gpu, 10_000, "comp_begin"))  # connected
        service._iterate(0.01)  # a timeout: ticks
        ticked = len(ticks)
        send_and_serve(service, core, push, event(gpu, 0, "comp_begin"))
        assert len(ticks) == ticked  # skipped
        began_s = time.monotonic()
        service._iterate(3600.0)  # nothing comes: the poll ends when the skipped tick is due
        assert len(ticks) == ticked + 1
        assert time.monotonic() - began_s < period_s + WAIT_S / 2


def test_a_request_is_followed_by_a_tick_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "TICK_PERIOD_S", 3600.0)  # events alone would never tick again
    with running_service(tmp_path) as (service, core, ticks, gpu), zmq_context() as ctx:
        push = connected(ctx, zmq.PUSH, tmp_path / "run" / "events.sock")
        dealer = connected(ctx, zmq.DEALER, tmp_path / "run" / "control.sock")
        dealer.send(encode(StatusRequest(), 6))
        serve_until(service, lambda: bool(dealer.poll(0)))  # both connected
        dealer.recv()
        send_and_serve(service, core, push, event(gpu, 10_000, "comp_begin"))
        service._iterate(0.01)  # a timeout: ticks
        ticked = len(ticks)
        for microbatch in range(5):
            send_and_serve(service, core, push, event(gpu, microbatch, "comp_begin"))
        assert len(ticks) == ticked  # events only: no tick within the period
        ticks_at_reply: list[int] = []

        def replied(request_id: int) -> None:
            if request_id == 7:
                ticks_at_reply.append(len(ticks))

        on_replies(service._ipc, replied)
        dealer.send(encode(StatusRequest(), 7))
        # Judged on the daemon's side: a poll that times out before the request arrives ticks too, so the
        # loop runs until it has replied and stops after that iteration, which must have ticked after it.
        serve_until(service, lambda: bool(ticks_at_reply), poll_s=WAIT_S)
        assert len(ticks) > ticks_at_reply[0]
        assert dealer.poll(int(WAIT_S * 1000))
        assert json.loads(dealer.recv())["id"] == 7

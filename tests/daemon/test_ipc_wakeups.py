"""The main loop waits on its sockets' ZMQ_FDs (edge-triggered) instead of `zmq_poll`: whatever is left on a
socket it used, or asked about, is served without another message arriving first. Real sockets, the real
service loop; each wait is long (a lost wake-up shows as a loop that sleeps its whole poll)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq
from perseus_client.protocol import StatusRequest, encode

from perseusd.daemon.event_intake import EVENT_BATCH
from tests.daemon.test_service_ticks import event, running_service, send_and_serve
from tests.support.daemon_core import on_replies
from tests.support.sockets import connected, zmq_context

pytestmark = pytest.mark.timeout(180)
LONG_POLL_S = 60.0
"""What each iteration may wait: a loop that lost a wake-up sleeps this long (the tests bound it by half)."""
SETTLE_S = 0.5
"""Time for a burst to reach the daemon's queue before the loop runs (shorter only makes the test weaker)."""


def test_events_beyond_a_batch_are_read_without_another_event(tmp_path: Path) -> None:
    with running_service(tmp_path) as (service, core, _ticks, gpu):
        with zmq_context() as ctx:
            push = connected(ctx, zmq.PUSH, tmp_path / "run" / "events.sock")
            send_and_serve(service, core, push, event(gpu, 10_000, "comp_begin"))  # connected
            before = core.tracker.received
            burst = 3 * EVENT_BATCH + 7
            for microbatch in range(burst):
                push.send(event(gpu, microbatch, "comp_begin"))
            time.sleep(SETTLE_S)
            began_s = time.monotonic()
            while core.tracker.received < before + burst:
                service._iterate(LONG_POLL_S)
                assert time.monotonic() - began_s < LONG_POLL_S / 2
        assert core.tracker.dropped == 0


def test_a_request_that_arrives_during_a_drain_is_served_at_once(tmp_path: Path) -> None:
    """Draining events asks the request sockets whether a request waits (taking their descriptors' edges)
    and stops for it: the request is then served at once, not after the next message or the poll's
    timeout."""
    with running_service(tmp_path) as (service, core, _ticks, gpu), zmq_context() as ctx:
        push = connected(ctx, zmq.PUSH, tmp_path / "run" / "events.sock")
        dealer = connected(ctx, zmq.DEALER, tmp_path / "run" / "control.sock")
        dealer.send(encode(StatusRequest(), 1))
        began_s = time.monotonic()
        while not dealer.poll(0):  # both connected
            service._iterate(0.05)
            assert time.monotonic() - began_s < LONG_POLL_S / 2
        dealer.recv()
        send_and_serve(service, core, push, event(gpu, 10_000, "comp_begin"))
        real_count = core.count_received
        read: list[int] = []

        def count_received() -> None:  # the request arrives while the loop reads the burst
            read.append(1)
            if len(read) == 1:
                dealer.send(encode(StatusRequest(), 2))
                time.sleep(SETTLE_S)
            real_count()

        core.count_received = count_received  # type: ignore[method-assign]
        ipc = service._ipc
        intake = ipc._intake
        real_waiting = intake._requests_waiting
        answers: list[bool] = []

        def requests_waiting() -> bool:
            answers.append(real_waiting())
            return answers[-1]

        intake._requests_waiting = requests_waiting
        replied: list[int] = []
        on_replies(ipc, replied.append)
        for microbatch in range(EVENT_BATCH):
            push.send(event(gpu, microbatch, "comp_begin"))
        time.sleep(SETTLE_S)
        began_s = time.monotonic()
        # Judged on the daemon's side (it replied): the reply's way back to the dealer may take longer
        # than a loop iteration on a loaded machine, and a loop with nothing left to do sleeps its poll.
        while 2 not in replied:
            service._iterate(LONG_POLL_S)
            assert time.monotonic() - began_s < LONG_POLL_S / 2
        assert dealer.poll(30_000)
        assert json.loads(dealer.recv())["id"] == 2
        assert True in answers  # the drain asked, found the request and stopped for it

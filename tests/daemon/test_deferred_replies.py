"""A request that reads the GPUs (`status`, `energy_read`) never holds the main loop while a GPU's owner
thread is in a call: the loop serves events and other requests meanwhile and sends the reply once the GPUs
answered (`perseusd.daemon.deferred`). Real sockets, the real service loop, a simulated GPU made slow to set
its clock; and the replies' bookkeeping on its own."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq
from perseus_client.protocol import (
    EnergyRead,
    EnergyReading,
    EventCount,
    EventCountOk,
    StatusReply,
    StatusRequest,
    decode_reply,
    encode,
)

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.deferred import Deferred, DeferredReplies, resolved
from perseusd.daemon.service import Service
from tests.daemon.test_service_ticks import event, send_and_serve
from tests.support.daemon_core import busy_owner, leased_service, sim_core
from tests.support.sockets import connected, zmq_context

pytestmark = pytest.mark.timeout(120)
SLOW_SET_S = 1.5
"""How long the slow GPU's clock set blocks its owner thread."""
WAIT_S = 60.0  # a bound on waiting, not a timing assertion


def _reply(sock: zmq.Socket[bytes]) -> Any:
    return decode_reply(sock.recv(zmq.NOBLOCK), 1 << 24)


@contextmanager
def busy_gpu_service(tmp_path: Path) -> Iterator[tuple[Service, DaemonCore, str, str, Future[int]]]:
    """The service loop over two simulated GPUs: the first leased by this process, the second's owner thread
    inside a clock set of `SLOW_SET_S` (its Future given)."""
    with sim_core(tmp_path, gpus=2) as core:
        service, ipc, gpu = leased_service(core, tmp_path)
        try:
            slow = core.registry.uuids[1]
            setting = busy_owner(core.registry, slow, SLOW_SET_S)
            yield service, core, gpu, slow, setting
        finally:
            ipc.close()


def _serve_until_reply(service: Service, sock: zmq.Socket[bytes], began_s: float) -> Any:
    while not sock.poll(0):
        service._iterate(0.05)
        assert time.monotonic() - began_s < WAIT_S
    return _reply(sock)


def test_a_status_waits_for_a_busy_gpu_without_holding_the_loop(tmp_path: Path) -> None:
    with busy_gpu_service(tmp_path) as (service, core, gpu, slow, setting), zmq_context() as ctx:
        push = connected(ctx, zmq.PUSH, tmp_path / "run" / "events.sock")
        status = connected(ctx, zmq.DEALER, tmp_path / "run" / "control.sock")
        other = connected(ctx, zmq.DEALER, tmp_path / "run" / "control.sock")
        status.send(encode(StatusRequest(), 1))
        other.send(encode(EventCount(), 2))
        began_s = time.monotonic()
        assert isinstance(_serve_until_reply(service, other, began_s).message, EventCountOk)
        assert not setting.done()  # served while the status waits for the slow GPU
        assert not status.poll(0)
        received = core.tracker.received
        send_and_serve(service, core, push, event(gpu, 0, "comp_begin"))  # events too
        assert core.tracker.received == received + 1
        assert not setting.done()
        reply = _serve_until_reply(service, status, began_s)
        assert setting.done()
        assert reply.request_id == 1
        assert isinstance(reply.message, StatusReply)
        rows = {row.uuid: row for row in reply.message.gpus}
        assert rows[slow].locked_clock_mhz == 1200
        assert rows[slow].error is None
        assert rows[gpu].error is None
        assert rows[gpu].lease is not None


def test_an_energy_read_of_a_busy_gpu_is_sent_when_it_answers(tmp_path: Path) -> None:
    with busy_gpu_service(tmp_path) as (service, _core, gpu, slow, setting), zmq_context() as ctx:
        both = connected(ctx, zmq.DEALER, tmp_path / "run" / "control.sock")
        quick = connected(ctx, zmq.DEALER, tmp_path / "run" / "control.sock")
        both.send(encode(EnergyRead(gpus=(slow, gpu)), 7))
        quick.send(encode(EnergyRead(gpus=(gpu,)), 8))  # the other GPU alone: not held up
        began_s = time.monotonic()
        alone = _serve_until_reply(service, quick, began_s).message
        assert not setting.done()
        assert not both.poll(0)
        assert isinstance(alone, EnergyReading)
        assert alone.gpus[0].energy_j is not None
        reply = _serve_until_reply(service, both, began_s)
        assert reply.request_id == 7
        assert isinstance(reply.message, EnergyReading)
        assert [g.uuid for g in reply.message.gpus] == [slow, gpu]
        assert all(g.energy_j is not None and g.error == "" for g in reply.message.gpus)


def test_a_reply_is_sent_once_every_call_is_done_and_the_loop_is_woken() -> None:
    replies = DeferredReplies()
    try:
        calls: list[Future[int]] = [Future(), Future()]
        sent: list[str] = []
        replies.add(Deferred(tuple(calls), lambda: EventCountOk(0, 0), 60.0), lambda: sent.append("a"))
        poller = select.poll()
        poller.register(replies.fd, select.POLLIN)
        calls[0].set_result(1)
        replies.serve()
        assert sent == []
        assert replies.waiting == 1
        threading.Thread(target=calls[1].set_result, args=(2,)).start()  # an owner thread's call ends
        assert poller.poll(int(WAIT_S * 1000))  # the loop's poll wakes
        replies.serve()
        assert sent == ["a"]
        assert replies.waiting == 0
        replies.serve()  # nothing left: neither blocks nor sends again
        assert sent == ["a"]
    finally:
        replies.close()


def test_a_reply_whose_gpu_never_answers_is_sent_when_its_wait_is_over() -> None:
    now_s = [100.0]
    replies = DeferredReplies(clock=lambda: now_s[0])
    try:
        stuck: Future[int] = Future()
        sent: list[int] = []
        replies.add(Deferred((stuck,), lambda: EventCountOk(0, 0), 5.0), lambda: sent.append(1))
        now_s[0] = 104.9
        replies.send_ready()
        assert sent == []
        now_s[0] = 105.0
        replies.send_ready()
        assert sent == [1]
        assert replies.waiting == 0
    finally:
        replies.close()
    stuck.set_result(0)  # a call that ends after the daemon closed wakes nothing and raises nothing


def test_resolved_waits_for_the_calls_off_the_loop() -> None:
    call: Future[int] = Future()
    threading.Timer(0.05, call.set_result, args=(3,)).start()
    reply = resolved(Deferred((call,), lambda: EventCountOk(call.result(), 0), WAIT_S))
    assert reply == EventCountOk(3, 0)
    assert resolved(EventCountOk(1, 0)) == EventCountOk(1, 0)

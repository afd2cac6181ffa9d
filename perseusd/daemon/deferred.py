"""Replies that wait for GPU calls without holding the main loop (`status`, `energy_read`).

A GPU's owner thread answers a read only after the call it is in: a clock set blocks 9-15 ms on an H100. A
request that reads the GPUs hands the IPC layer a `Deferred` (the reads' Futures and how to build the reply
from them) and the loop goes on serving events and requests meanwhile: a monitor polling `status` must not
delay the event that lowers another GPU's clock. Each Future, once done, wakes the loop through an eventfd;
the reply is built and sent on the loop once every Future is done, or once `wait_s` has passed (a GPU stuck
in a call: its reading then says so). Replies keep no order across requests: each names its request id,
and a client waits for one request at a time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from perseus_client.protocol import Message


@dataclass(frozen=True)
class Deferred:
    """A reply to build on the loop once each of `futures` is done, or `wait_s` after the request."""

    futures: tuple[Future[Any], ...]
    finish: Callable[[], Message]
    wait_s: float


def resolved(reply: Message | Deferred) -> Message:
    """`reply`, a deferred one built after waiting for its calls (for callers off the loop, and tests)."""
    if isinstance(reply, Deferred):
        wait(reply.futures, timeout=reply.wait_s)
        return reply.finish()
    return reply


@dataclass
class _Waiting:
    futures: tuple[Future[Any], ...]
    send: Callable[[], None]
    deadline_s: float


class DeferredReplies:
    """The deferred replies not yet sent; `fd` becomes readable when one of their calls is done."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._fd_lock = threading.Lock()  # a wake-up never writes to a closed (or reused) descriptor
        self._waiting: list[_Waiting] = []

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def waiting(self) -> int:
        """How many replies wait for their calls."""
        return len(self._waiting)

    def add(self, deferred: Deferred, send: Callable[[], None]) -> None:
        """Call `send` on the loop once `deferred`'s calls are done or its wait is over."""
        self._waiting.append(_Waiting(deferred.futures, send, self._clock() + deferred.wait_s))
        for future in deferred.futures:
            future.add_done_callback(self._wake)

    def serve(self) -> None:
        """The eventfd fired: take its count and send what is ready."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._fd)
        self.send_ready()

    def send_ready(self) -> None:
        """Send each reply whose calls are all done or whose wait is over."""
        if not self._waiting:
            return
        now_s = self._clock()
        ready = [w for w in self._waiting if now_s >= w.deadline_s or all(f.done() for f in w.futures)]
        if not ready:
            return
        self._waiting = [w for w in self._waiting if not any(w is r for r in ready)]
        for waiting in ready:
            waiting.send()

    def close(self) -> None:
        """Drop the replies still waiting; their calls' wake-ups go nowhere."""
        self._waiting.clear()
        with self._fd_lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _wake(self, _future: Future[Any]) -> None:
        """Any thread: a call is done."""
        with self._fd_lock:
            if self._fd >= 0:
                os.eventfd_write(self._fd, 1)

"""A stand-in for the daemon's control socket: a real ZeroMQ ROUTER bound at a path, without the daemon's
logic, answering each request as a test says, on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import zmq
from perseus_client.closing import Closing

Answer = Callable[[bytes], "bytes | list[bytes] | None"]
"""A request's reply: one frame, several (a multipart reply), or None (left unanswered)."""


class StubDaemon(Closing):
    """A ROUTER at `path` answering each request with `answer(request)`; `seen` holds every request."""

    def __init__(self, path: Path, answer: Answer) -> None:
        self.seen: list[bytes] = []
        self._answer = answer
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(f"ipc://{path}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            peer, data = self._sock.recv_multipart()
            self.seen.append(data)
            reply = self._answer(data)
            if reply is not None:
                self._sock.send_multipart([peer, *([reply] if isinstance(reply, bytes) else reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)

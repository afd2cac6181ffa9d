"""`RangeWatch`: one etcd watch stream on a key range, used as a wake-up, on a thread of its own.

A node of a large pool cannot poll etcd every round (a thousand nodes polling twice a second is thousands of
requests a second on the etcd members); it watches the few keys that concern it and reads them when they
change. The watch is only a hint: `on_change` is called for each batch of events and once after every
(re)connection (events may have been missed while it was down), and the reader then reads etcd as before. A
stream that breaks (a member killed, a connection reset) is opened again on the next endpoint after a short
pause. A stream that hangs without breaking (a silent partition) is not detected here: its owner still
reads at its slow cadence, so a hung watch only costs latency.

Through the gRPC gateway (`/v3/watch`, one HTTP response streamed per watch), with `requests`, which the
`cluster` extra (`etcd3gw`) brings. Imported only when the cluster plane or a pool is used.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import requests

from perseusd.cluster.config import Endpoint
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

RECONNECT_PAUSE_S = 0.2
"""Pause before opening a broken stream again (on the next endpoint)."""

NO_PUT = "NOPUT"
"""A filter: deliver deletions only."""


class RangeWatch:
    """Calls `on_change(events)` for the changes in [key, range_end) (see module); `start()`, `stop()`."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        key: str,
        range_end: str | None,
        on_change: Callable[[list[dict[str, Any]]], None],
        timeout_s: float,
        filters: Sequence[str] = (),
        name: str = "perseusd-watch",
    ) -> None:
        self._urls = [f"{e.url}/v3/watch" for e in endpoints]
        request: dict[str, Any] = {"key": _b64(key)}
        if range_end is not None:
            request["range_end"] = _b64(range_end)
        if filters:
            request["filters"] = list(filters)
        self._body = {"create_request": request}
        self._on_change, self._timeout_s, self._name = on_change, timeout_s, name
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._response: requests.Response | None = None
        self._session = requests.Session()
        self._thread: threading.Thread | None = None
        self._index = 0
        self.connections = 0
        """How many streams were opened (1 + reconnections)."""
        self.events = 0

    def start(self) -> None:
        self._thread = NamedThread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the stream and the thread (waits at most a second for the thread)."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            _shut(response)
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._session.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._stream()
            except (OSError, ValueError, requests.RequestException) as exc:
                logger.debug("watch %s on %s broke: %s", self._name, self._urls[self._index], exc)
            if self._stopping.is_set():
                return
            self._index = (self._index + 1) % len(self._urls)
            self._stopping.wait(RECONNECT_PAUSE_S)

    def _stream(self) -> None:
        response = self._session.post(
            self._urls[self._index], json=self._body, stream=True, timeout=(self._timeout_s, None)
        )
        with self._lock:
            self._response = response
        if self._stopping.is_set():
            _shut(response)
            return
        try:
            response.raise_for_status()
            for line in response.iter_lines():
                if self._stopping.is_set():
                    return
                if line.strip():
                    self._deliver(json.loads(line))
        finally:
            with self._lock:
                self._response = None
            response.close()

    def _deliver(self, chunk: dict[str, Any]) -> None:
        result = chunk.get("result")
        if not isinstance(result, dict):
            raise ValueError(f"watch answered {str(chunk)[:200]}")
        if result.get("created"):
            self.connections += 1
            self._on_change([])  # (re)connected: whatever happened meanwhile is read now
            return
        if result.get("canceled"):
            raise ValueError(f"watch canceled: {result.get('cancel_reason', '')}")
        events = result.get("events") or []
        if events:
            self.events += len(events)
            self._on_change(events)


def _shut(response: requests.Response) -> None:
    """Unblock a thread reading `response` (closing it from another thread does not)."""
    try:
        fileno = response.raw._fp.fileno()  # urllib3 hides its socket
        sock = socket.fromfd(fileno, socket.AF_INET, socket.SOCK_STREAM)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    except (AttributeError, OSError, ValueError):
        pass


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def event_key(event: dict[str, Any]) -> str:
    """The key an event is about."""
    return base64.b64decode(event.get("kv", {}).get("key", "")).decode("utf-8", "replace")

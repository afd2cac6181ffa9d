"""The client's connection to perseusd: its state, its sockets, and the sessions it opens (hello and replay).

`ClientConnection` is the base of `PerseusClient` (`perseus_client.client`): it holds everything a client
knows (the counters of its events and calls included) and owns the sockets: ZeroMQ's control socket (DEALER)
and event socket (PUSH), and a session's SOCK_SEQPACKET event connection (`perseus_client.seqpacket`), which
the hello names. A monitor thread follows the control link: when the daemon (re)appears, the client says hello
again and replays what it asked (`perseus_client.session`); when it goes away, the client goes on unmanaged
and warns once. The calls (`perseus_client.control_calls`) and the events (`perseus_client.event_sending`) are
the parts built on it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import zmq

from perseus_client import seqpacket
from perseus_client.carrying import Carrier
from perseus_client.event_frames import EventWriter
from perseus_client.link import PerseusClientError, monitor_event, request_reply, unreachable
from perseus_client.protocol import (
    CONTROL_SOCKET_NAME,
    EVENT_SOCKET_NAME,
    PROTOCOL_MINOR,
    Carry,
    CarryReady,
    Hello,
    HelloOk,
    Message,
    encode,
)
from perseus_client.session import SessionMemory

logger = logging.getLogger(__name__)

CLIENT_VERSION = "0.1.0"
EVENT_SNDHWM = 500
"""Events queued towards a slow daemon before new ones are dropped (and counted): a small queue keeps the
daemon's backlog, and so the time it spends on events of a lease already released, short."""
EVENT_SNDBUF_BYTES = 64 * 1024
"""The kernel's share of that queue (the socket buffer), kept small for the same reason."""
CARRY_SINCE = Carry.SINCE
"""The daemon's minor from which it may say which events wait for the next one (`perseus_client.carrying`)."""
RETRY_MIN_S = 0.25
RETRY_MAX_S = 5.0
"""Back-off of a new session's hello while the link is up but the daemon does not answer."""
M = TypeVar("M", bound=Message)


class ClientConnection:
    """What a client knows, and its sockets and sessions with the daemon (see `PerseusClient`)."""

    def __init__(self, runtime_dir: Path, job: str, timeout_s: float, strict: bool) -> None:
        self.runtime_dir = runtime_dir
        self.job = job
        self.timeout_s = timeout_s
        self.strict = strict
        self.events_sent = 0
        self.events_dropped = 0
        self.events_lost = 0
        self.calls_skipped = 0
        self.reconnects = 0
        self._session_sent = 0  # events sent since the hello that opened this session with the daemon
        self.daemon_info: HelloOk | None = None
        self.protocol_minor = PROTOCOL_MINOR
        """The minor this client writes in: its own, or the daemon's when older (known from the hello)."""
        self.auth_failed = False
        self.managed = False
        self._memory = SessionMemory()
        self._frames = EventWriter()  # every event frame, written as the protocol writes it
        self._carrier = Carrier()  # the events the daemon lets wait for the next one, and those waiting
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._ctx: zmq.Context[Any] | None = None
        self._control: zmq.Socket[bytes] | None = None
        self._events: zmq.Socket[bytes] | None = None
        self._datagrams: seqpacket.EventSocket | None = None
        """The SOCK_SEQPACKET event connection of this session (None: events go to ZeroMQ's socket)."""
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self._link_up = False
        self._wanted = False  # connect() was called: the monitor opens sessions by itself
        self._away_warned = False
        self._away = False  # known out of reach: calls fail at once instead of waiting for their timeout

    def _open_sockets(self) -> None:
        self._ctx = zmq.Context()
        control = self._ctx.socket(zmq.DEALER)
        control.setsockopt(zmq.LINGER, 0)
        control.setsockopt(zmq.IMMEDIATE, 1)
        monitor = control.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_DISCONNECTED
        )
        control.connect(f"ipc://{self.runtime_dir / CONTROL_SOCKET_NAME}")
        events = self._ctx.socket(zmq.PUSH)
        events.setsockopt(zmq.LINGER, 0)
        events.setsockopt(zmq.SNDHWM, EVENT_SNDHWM)
        events.setsockopt(zmq.SNDBUF, EVENT_SNDBUF_BYTES)
        events.setsockopt(zmq.IMMEDIATE, 1)
        events.connect(f"ipc://{self.runtime_dir / EVENT_SOCKET_NAME}")
        self._control, self._events = control, events
        self._monitor = threading.Thread(
            target=self._watch_connection, args=(monitor,), name="perseus-client-monitor", daemon=True
        )
        self._monitor.start()

    def _watch_connection(self, monitor: zmq.Socket[bytes]) -> None:
        """Follow the link; open a session (hello and replay) whenever the link is up without one."""
        retry_at_s, backoff_s = 0.0, RETRY_MIN_S
        try:
            while not self._closing.is_set():
                if monitor.poll(100):
                    event = monitor_event(monitor.recv_multipart())
                    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                        self.auth_failed = True
                    elif event == zmq.EVENT_DISCONNECTED:
                        self._link_up = False
                        self._went_away(None)
                    elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        self.auth_failed = False
                        self._link_up = True
                        retry_at_s, backoff_s = 0.0, RETRY_MIN_S
                if not (self._link_up and self._wanted and not self.managed):
                    continue
                if time.monotonic() >= retry_at_s and not self._reopen():
                    retry_at_s = time.monotonic() + backoff_s
                    backoff_s = min(RETRY_MAX_S, backoff_s * 2)
        except zmq.ZMQError:
            pass
        finally:
            monitor.close(linger=0)

    def _reopen(self) -> bool:
        """Hello again and replay what this client asked; False when the daemon is out of reach again."""
        with self._lock:
            if self._control is None or self.managed or self._closing.is_set():
                return True
            try:
                self._hello()
                summary = self._memory.replay(self._call, self.job)
            except PerseusClientError as exc:
                self.managed = False
                logger.debug("perseus: opening a session failed: %s", exc)
                return False
            self._opened()
            self.reconnects += 1  # after: a count seen means the session is open
            logger.info("perseus: connected to the daemon at %s: %s", self.runtime_dir, summary)
            return True

    def _went_away(self, exc: PerseusClientError | None) -> None:
        """The daemon is out of reach: go on unmanaged; warn once per absence."""
        self.managed = False
        self._away = True
        self.events_dropped += self._carrier.reset()
        if self._away_warned or self._closing.is_set() or self.strict:  # strict: the caller gets the error
            return
        self._away_warned = True
        cause = exc.message if exc is not None else f"lost the daemon at {self.runtime_dir}"
        logger.warning(
            "perseus: %s; training goes on unmanaged (events dropped and counted); the client reconnects "
            "when the daemon is back",
            cause,
        )

    def _open(self) -> HelloOk:
        """Hello, and the session is open."""
        reply = self._hello()
        self._opened()
        return reply

    def _opened(self) -> None:
        self.managed = True
        self._away = self._away_warned = False

    def _hello(self) -> HelloOk:
        self.protocol_minor = PROTOCOL_MINOR  # the daemon may have been replaced by another version
        self._session_sent = 0  # the daemon counts this session's events from its hello
        self._use_datagrams(None)  # a new session's events go on a new connection (or ZeroMQ's socket)
        self.events_dropped += self._carrier.reset()
        reply = self._call(Hello(job=self.job, client_version=CLIENT_VERSION), HelloOk)
        self.daemon_info = reply
        self.protocol_minor = min(PROTOCOL_MINOR, reply.protocol_minor)
        if reply.event_socket is not None:
            self._use_datagrams(seqpacket.connect(self.runtime_dir, reply.event_socket))
        if self._datagrams is not None and self.protocol_minor >= CARRY_SINCE:
            self._datagrams.send(encode(CarryReady(), minor=self.protocol_minor))
        return reply

    def _use_datagrams(self, events: seqpacket.EventSocket | None) -> None:
        old, self._datagrams = self._datagrams, events
        if old is not None:
            old.close()

    def _call(self, request: Message, expected: type[M]) -> M:
        with self._lock:
            if self._control is None:
                raise PerseusClientError("NOT_CONNECTED", "call connect() first", reached=False)
            if self._away and not (self.strict or self._control.poll(0, zmq.POLLOUT)):
                raise unreachable(self, None, "the daemon is out of reach")  # fail-open: never wait
            try:
                return request_reply(
                    self._control,
                    request,
                    expected,
                    timeout_s=self.timeout_s,
                    request_id=next(self._ids),
                    client=self,
                )
            except PerseusClientError as exc:
                if exc.lost_link:
                    self.managed = False
                raise

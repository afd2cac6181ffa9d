"""The event stream in, from either transport: counted, then delivered to the core or dropped (hot path).

Part of the IPC layer (`perseusd.daemon.ipc`, which owns the sockets and the loop). Events come as single
frames on the ZeroMQ PULL socket, or as datagrams of one frame or several (carried, protocol 6.11) on the
SOCK_SEQPACKET socket (`perseusd.daemon.seqpacket`); every frame is attributed to its sender's kernel
credentials, never to what it says. Nothing here logs per event: each frame is counted, and the warnings
about dropped ones are rate-limited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import zmq
from perseus_client.carrying import MAX_HELD, SEPARATOR
from perseus_client.protocol import (
    EVENT_TYPES,
    PROTOCOL_MAJOR,
    Carry,
    CarryReady,
    ErrorCode,
    EventsEnd,
    Message,
    ProtocolError,
)

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.event_frames import decode_event
from perseusd.daemon.rate_limited_log import RateLimitedLog
from perseusd.daemon.socket_poller import readable
from perseusd.leasing.identity import Caller

EVENT_BATCH = 128
"""Events read per poll before the other sockets (status, claims) get their turn."""
REQUEST_CHECK_EVENTS = 16
"""Within a batch, every this many events the daemon looks for a waiting request and serves it first: under
a flood the daemon runs in short CPU slices, and a request should not wait for a whole batch of events."""
MAX_FRAMES_PER_DATAGRAM = 2 * MAX_HELD + 1
"""Event frames one datagram may hold (protocol 6.11: a client carries at most `MAX_HELD` before one sent at
once); a datagram of more is dropped whole, unread, as TOO_LARGE."""
_NEWER_MINOR_HEAD = b'{"v":%d,"id":0,"m":' % PROTOCOL_MAJOR
"""How a frame of the event socket written in minor 1 or later starts (events are minor 0, without "m"):
such a frame (the end marker) is decoded even from a process without a lease."""


class EventIntake:
    """Reads the ZeroMQ event socket in bounded batches and takes the SOCK_SEQPACKET socket's datagrams.

    `caller` attributes a frame's `Peer-Address` to its sender; `requests_waiting` is asked within a batch
    (a waiting request ends it); `tell_carries` sends a client what it may carry, (pid, message) each.
    """

    def __init__(
        self,
        core: DaemonCore,
        events: zmq.Socket[bytes],
        log: RateLimitedLog,
        caller: Callable[[str | None], Caller | None],
        requests_waiting: Callable[[], bool],
        tell_carries: Callable[[Iterable[tuple[int, Carry]]], None],
        *,
        max_frame_bytes: int,
        minor: int,
    ) -> None:
        self._core = core
        self._events = events
        self._log = log
        self._caller = caller
        self._requests_waiting = requests_waiting
        self._tell_carries = tell_carries
        self.max_frame_bytes = max_frame_bytes
        """The longest frame decoded (a SIGHUP may change it)."""
        self._minor = minor

    def drain(self) -> None:
        """Read up to EVENT_BATCH events; whatever a frame holds, it is counted and never raises.

        A frame from a process that holds no lease (typically the backlog of a lease just released) is
        dropped unread: counted as NOT_LEASED, as decoding it would end, at a small fraction of the cost.
        """
        sock = self._events
        count_received = self._core.count_received
        event_frame = self._event_frame
        for count in range(EVENT_BATCH):
            if count:  # the poll said the first is there; ask before the others (cheaper than zmq.Again)
                if not readable(sock):
                    return
                if count % REQUEST_CHECK_EVENTS == 0 and self._requests_waiting():
                    return
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if frame.more:
                count_received()
                self._discard_rest()
                self._drop_event(None, ErrorCode.BAD_FRAME, "events are single frames")
                continue
            caller = self._caller(str(frame.get("Peer-Address")))
            if caller is None:
                count_received()
                self._drop_event(None, ErrorCode.PERMISSION_DENIED, "caller unknown")
                continue
            event_frame(caller, frame.bytes)

    def datagram(self, caller: Caller, data: bytes) -> int:
        """One datagram of the SOCK_SEQPACKET socket: one event frame, or several, one a line (carried); how
        many frames it held (the reader's batch counts frames, so a request waits no longer behind them)."""
        if SEPARATOR not in data:
            self._event_frame(caller, data)
            return 1
        frames = data.split(SEPARATOR, MAX_FRAMES_PER_DATAGRAM)
        if len(frames) > MAX_FRAMES_PER_DATAGRAM:
            self._core.count_received()
            self._drop_event(
                caller, ErrorCode.TOO_LARGE, f"a datagram of over {MAX_FRAMES_PER_DATAGRAM} frames"
            )
            return MAX_FRAMES_PER_DATAGRAM
        for frame in frames:
            self._event_frame(caller, frame)
        return len(frames)

    def _event_frame(self, caller: Caller, data: bytes) -> None:
        """One frame of `caller`'s event stream (either transport): counted, then used or dropped; never
        raises. A frame from a process that holds no lease (typically the backlog of a lease just released)
        is dropped unread: counted as NOT_LEASED, as decoding it would end, at a fraction of the cost."""
        core = self._core
        core.count_received()
        try:
            if not core.accepts_events_from(caller.pid) and not data.startswith(_NEWER_MINOR_HEAD):
                self._drop_unleased(caller)
                return
            message = decode_event(data, self.max_frame_bytes, self._minor)
            if type(message) not in EVENT_TYPES:
                self._stream_frame(caller, message)
                return
            core.deliver_event(caller, message)
        except ProtocolError as exc:
            self._drop_event(caller, exc.code, exc.message)
        except Exception as exc:  # a bad frame never takes the daemon down
            self._drop_event(caller, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    def oversized(self, caller: Caller, length: int) -> None:
        """A datagram longer than any event frame: counted and dropped (TOO_LARGE), its sender served on."""
        self._core.count_received()
        self._drop_event(caller, ErrorCode.TOO_LARGE, f"event datagram of {length} bytes from {caller.pid}")

    def _stream_frame(self, caller: Caller, message: Message) -> None:
        """A frame of the event stream that is not an event: the end marker, a client's `carry_ready`, or
        refused (UNKNOWN_TYPE)."""
        if isinstance(message, EventsEnd):
            self._core.end_events(caller, message)
        elif isinstance(message, CarryReady):
            told = self._core.carry_ready(caller)
            self._tell_carries((caller.pid, carry) for carry in told)
        else:
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{message.TYPE} is not an event")

    def _drop_event(self, caller: Caller | None, code: ErrorCode, message: str) -> None:
        self._core.count_dropped(caller.pid if caller is not None else None, code)
        self._log.warning(f"event-{code}", "event dropped: %s: %s", code, message)

    def _drop_unleased(self, caller: Caller) -> None:
        """Count an event of a process without a lease, unread (no decoding, no formatting)."""
        self._core.count_dropped(caller.pid, ErrorCode.NOT_LEASED)
        self._log.warning("event-unleased", "events dropped unread: process %d holds no lease", caller.pid)

    def _discard_rest(self) -> None:
        while self._events.getsockopt(zmq.RCVMORE):
            self._events.recv(zmq.NOBLOCK)

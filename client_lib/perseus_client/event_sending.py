"""The client's events: computation and step begins and ends, sent from the training thread, settled at close.

`EventSending` is the part of `PerseusClient` (`perseus_client.client`) that sends events on the sockets of
its connection (`perseus_client.connection`). Events never block and never raise: without a daemon session
they are dropped and counted, at a fraction of a sent event's cost; otherwise each is written by
`perseus_client.event_frames` and sent in one non-blocking send, on the session's SOCK_SEQPACKET connection
(with the frames the daemon let wait, `perseus_client.carrying`) or on ZeroMQ's event socket, and dropped
and counted where that connection is full or gone. At close, the client waits (bounded) until the daemon has
read every event it sent and counts the rest as lost.

Send events from one thread per client (ZeroMQ sockets are not thread-safe).
"""

from __future__ import annotations

import logging
import time

import zmq

from perseus_client import seqpacket
from perseus_client.connection import CARRY_SINCE, ClientConnection
from perseus_client.link import PerseusClientError, request_reply
from perseus_client.protocol import Carry, EventCount, EventCountOk, EventsEnd, decode_reply, encode

logger = logging.getLogger(__name__)

CLOSE_SETTLE_S = 30.0
CLOSE_STALL_S = 3.0
"""At close, the client waits until the daemon has read every event it sent, at most CLOSE_SETTLE_S and at
most CLOSE_STALL_S without progress; events still unread then are counted in `events_lost`."""
EVENTS_END_SINCE = EventsEnd.SINCE
"""The daemon's minor from which the client ends its event stream with a marker (`events_end`)."""


class _Computation:
    """Context manager sending a computation's begin and end events (never raises)."""

    __slots__ = ("_args", "_client")

    def __init__(self, client: EventSending, args: tuple[str, int, str, int, int]) -> None:
        self._client = client
        self._args = args

    def __enter__(self) -> None:
        self._client.computation_begin(*self._args)

    def __exit__(self, *_exc: object) -> None:
        self._client.computation_end(*self._args)


class _Step:
    __slots__ = ("_client", "_gpu", "_step")

    def __init__(self, client: EventSending, gpu: str, step: int) -> None:
        self._client = client
        self._gpu = gpu
        self._step = step

    def __enter__(self) -> None:
        self._client.step_begin(self._gpu, self._step)

    def __exit__(self, *_exc: object) -> None:
        self._client.step_end(self._gpu, self._step)


class EventSending(ClientConnection):
    """The events of a client: sent without blocking, dropped and counted when they cannot be."""

    def computation(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> _Computation:
        """``with client.computation(gpu, stage, "forward", microbatch): ...`` sends begin and end."""
        return _Computation(self, (gpu, stage, instruction, microbatch, chunk))

    def step(self, gpu: str, step: int) -> _Step:
        return _Step(self, gpu, step)

    def computation_begin(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> None:
        self._send_computation(b"comp_begin", gpu, stage, instruction, microbatch, chunk)

    def computation_end(
        self, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int = 0
    ) -> None:
        self._send_computation(b"comp_end", gpu, stage, instruction, microbatch, chunk)

    def step_begin(self, gpu: str, step: int) -> None:
        if self._datagrams is not None and self.protocol_minor >= CARRY_SINCE:
            self._read_carries()
        self._send_step(b"step_begin", gpu, step)

    def step_end(self, gpu: str, step: int) -> None:
        self._send_step(b"step_end", gpu, step)

    @property
    def events_carried(self) -> int:
        """Events carried: held, then passed on in one datagram with others (protocol 6.11); those of a
        datagram that could not be sent are in `events_dropped` too."""
        return self._carrier.carried

    @property
    def event_transport(self) -> str:
        """How this session's events travel: "seqpacket" (protocol 6.10) or "zmq"."""
        return "zmq" if self._datagrams is None else "seqpacket"

    def _send_computation(
        self, kind: bytes, gpu: str, stage: int, instruction: str, microbatch: int, chunk: int
    ) -> None:
        if not self.managed:  # no session: dropped at once, nothing formatted
            self.events_dropped += 1
            return
        try:
            now_ns = time.monotonic_ns()
            frame = self._frames.computation(kind, gpu, stage, instruction, microbatch, chunk, now_ns)
            if not self._carrier.hold(
                kind == b"comp_begin", gpu, (instruction, microbatch, chunk), frame, now_ns
            ):
                self._send_event(frame)
        except Exception:  # never raise into training
            self.events_dropped += 1

    def _send_step(self, kind: bytes, gpu: str, step: int) -> None:
        if not self.managed:
            self.events_dropped += 1
            return
        try:
            self._send_event(self._frames.step(kind, gpu, step, time.monotonic_ns()))
        except Exception:  # never raise into training
            self.events_dropped += 1

    def _send_event(self, data: bytes) -> None:
        """Send one event frame, with the frames held before it, without waiting: counted sent, or dropped
        where the connection is full or gone; ZeroMQ's errors are the caller's to count."""
        datagrams, count = self._datagrams, 1
        if self._carrier.holding:
            data, count = self._carrier.join(data)
        if datagrams is None:
            self._events.send(data, zmq.NOBLOCK)  # type: ignore[union-attr]
        elif not datagrams.send(data):
            self._datagrams_failed(datagrams, count)
            return
        self.events_sent += count
        self._session_sent += count

    def _send_held(self) -> None:
        """Send the frames held (closing: the end marker must follow every event)."""
        data, count = self._carrier.join()
        if not count:
            return
        datagrams = self._datagrams
        if datagrams is None or not datagrams.send(data):
            self.events_dropped += count
            return
        self.events_sent += count
        self._session_sent += count

    def _read_carries(self) -> None:
        """What the daemon said of carried events since the last step (a step's begin asks: one ioctl)."""
        datagrams = self._datagrams
        try:
            while datagrams is not None and (data := datagrams.receive()) is not None:
                message = decode_reply(data).message
                if isinstance(message, Carry):
                    self._carrier.update(message)
        except Exception as exc:  # never raise into training: a frame not understood is passed over
            logger.debug("perseus: a frame from the daemon not understood: %s", exc)

    def _datagrams_failed(self, datagrams: seqpacket.EventSocket, count: int = 1) -> None:
        """Events not sent on the SOCK_SEQPACKET connection: dropped and counted. A connection the daemon
        closed (it went away, or refused it) is given up: the session's further events go to ZeroMQ's socket
        (which drops them while the daemon is away, and carries none); the next session opens a new one."""
        self.events_dropped += count
        if datagrams.broken and self._datagrams is datagrams:
            self._datagrams = None
            datagrams.close()
            self.events_dropped += self._carrier.reset()

    def _settle_events(self) -> None:
        """Wait (bounded) until the daemon read every event sent in this session; count the rest as lost.

        A daemon of minor 9 or later is sent an end marker (`events_end`) behind the last event: once it has
        read the marker, its count is final and `events_lost` is exactly what it never read, as it counts too
        (docs/protocol.md). An older daemon's count is taken as it stands when it stops moving.
        """
        sent, self._session_sent = self._session_sent, 0
        if self._control is None or sent <= 0:
            return
        if not self.managed:  # the daemon that had them is gone
            self.events_lost += sent
            return
        marking = self.protocol_minor >= EVENTS_END_SINCE
        end = EventsEnd(sent=sent, dropped=self.events_dropped)
        marker = encode(end, minor=self.protocol_minor) if marking else b""
        started_s = progress_s = time.monotonic()
        received = 0
        while True:
            now_s = time.monotonic()
            if marker:
                marker = self._send_marker(marker)
            try:
                reply = request_reply(
                    self._control,
                    EventCount(),
                    EventCountOk,
                    timeout_s=max(0.05, min(self.timeout_s, CLOSE_STALL_S)),
                    request_id=next(self._ids),
                    client=self,
                )
            except PerseusClientError:
                break  # the daemon is gone or does not count: what it did not confirm is lost
            if reply.received > received:
                received, progress_s = reply.received, now_s
            if (reply.ended_sent == sent) if marking else (received >= sent):
                break  # marked: the daemon read the marker, so every event it will ever read
            if now_s - progress_s > CLOSE_STALL_S or now_s - started_s > CLOSE_SETTLE_S:
                if marking:
                    logger.warning(
                        "perseus: closing before the daemon read %d of %d events; counted lost",
                        max(0, sent - received),
                        sent,
                    )
                break
            time.sleep(0.01)
        self.events_lost += max(0, sent - received)

    def _send_marker(self, marker: bytes) -> bytes:
        """Queue the end marker behind the events (b"" once queued; the queue may be full for a while)."""
        datagrams = self._datagrams
        if datagrams is not None and not datagrams.broken:  # on the events' connection: read after them
            return b"" if datagrams.send(marker) or datagrams.broken else marker
        try:
            self._events.send(marker, zmq.NOBLOCK)  # type: ignore[union-attr]
        except zmq.Again:
            return marker
        except zmq.ZMQError:
            pass  # the socket is gone: nothing more will be read; the settle ends on the count
        return b""

"""ZeroMQ transport (the only module that imports zmq): sockets, ZAP authentication, the poll loop.

Three `ipc://` sockets in the runtime directory: a control ROUTER (request/reply, DEALER clients), an event
PULL (fire-and-forget begin/end events) and an admin ROUTER; beside them the SOCK_SEQPACKET event socket of
protocol 6.10 (`perseusd.daemon.seqpacket`), polled in the same poll(2). A ZAP handler admits connections by
the peer's kernel credentials (SO_PEERCRED, `localhost:uid:gid:pid`), and every message is attributed to the
caller from its frame's `Peer-Address`, never from the request. Client pidfds are polled with the sockets.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import zmq
from perseus_client.carrying import MAX_HELD, SEPARATOR
from perseus_client.protocol import (
    ADMIN_SOCKET_NAME,
    ADMIN_TYPES,
    CONTROL_SOCKET_NAME,
    EVENT_SOCKET_NAME,
    EVENT_TYPES,
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    REQUEST_TYPES,
    SEQPACKET_EVENT_SOCKET_NAME,
    Carry,
    CarryReady,
    ErrorCode,
    ErrorReply,
    EventAck,
    EventsEnd,
    Frame,
    Message,
    ProtocolError,
    decode,
    encode,
)
from zmq.utils.monitor import parse_monitor_message

from perseusd.daemon.access import AccessPolicy
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.deferred import Deferred, DeferredReplies
from perseusd.daemon.event_frames import decode_event
from perseusd.daemon.limits import ConnectionBook, ConnectionLimits, peer_uid, shut_down
from perseusd.daemon.runtime_dir import SOCKET_MODE, reclaim_stale_socket, set_group
from perseusd.daemon.seqpacket import SeqpacketEvents, SeqpacketHandlers, SeqpacketListener
from perseusd.daemon.wire_errors import protocol_error
from perseusd.errors import PerseusError
from perseusd.leasing.identity import Caller, parse_peer_address

logger = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
CONTROL_DOMAIN = b"perseus"
ADMIN_DOMAIN = b"perseus-admin"
HARD_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
EVENT_BATCH = 128
"""Events read per poll before the other sockets (status, claims) get their turn."""
REQUEST_CHECK_EVENTS = 16
"""Within a batch, every this many events the daemon looks for a waiting request and serves it first: under
a flood the daemon runs in short CPU slices, and a request should not wait for a whole batch of events."""
EVENT_RCVHWM = 500
"""Events queued per client in the daemon: with the client's own queue (500 and a 64 KiB socket buffer), a
flood leaves about 1,300 events per client to drain, so the events of a released lease stop costing work at
once and memory stays flat; a client that sends faster than the daemon reads finds its queue full and counts
the drops."""
SEQPACKET_SINCE = 10
"""The minor whose daemons serve the SOCK_SEQPACKET event socket (`hello_ok`'s `event_socket`)."""
CARRY_SINCE = Carry.SINCE
"""The minor whose daemons tell clients which events may wait (`perseusd.switching.carrying`)."""
MAX_FRAMES_PER_DATAGRAM = 2 * MAX_HELD + 1
"""Event frames one datagram may hold (protocol 6.11: a client carries at most `MAX_HELD` before one sent at
once); a datagram of more is dropped whole, unread, as TOO_LARGE."""
MAX_ERROR_CHARS = 400
MAX_ECHOED_MAJOR = (1 << 31) - 1
DEFAULT_LIMITS = ConnectionLimits.for_descriptors(1024)
MONITORED_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_NEWER_MINOR_HEAD = b'{"v":%d,"id":0,"m":' % PROTOCOL_MAJOR
"""How a frame of the event socket written in minor 1 or later starts (events are minor 0, without "m"):
such a frame (the end marker) is decoded even from a process without a lease."""
_POLLIN = int(zmq.POLLIN)  # a plain int: `&` with the enum member costs an enum operation per event


class RateLimitedLog:
    """One log line per key per interval; the rest are counted and summarised on the next line."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self._interval_s = interval_s
        self._last_s: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, key: str, message: str, *args: object) -> None:
        """Log `message % args` unless `key` was logged within the interval (formatted only when logged)."""
        now_s = time.monotonic()
        if now_s - self._last_s.get(key, -1e9) < self._interval_s:
            self._suppressed[key] += 1
            return
        self._last_s[key] = now_s
        suppressed = self._suppressed.pop(key, 0)
        extra = f" ({suppressed} similar suppressed)" if suppressed else ""
        logger.warning("%s%s", message % args if args else message, extra)


class SocketPoller:
    """Waits on ZeroMQ sockets and plain descriptors with one poll(2) per wake-up.

    `zmq_poll` asks every ZeroMQ socket for its state (ZMQ_EVENTS: a poll of the socket's mailbox and a
    getpid) before and after it waits: with the daemon's seven sockets, about 17 poll(2) and 17 getpid calls
    for each event a training process sends. Here the kernel polls each socket's ZMQ_FD with the plain
    descriptors, and a socket is asked for its state only when its descriptor fired or when the loop used it
    since it was last asked: ZMQ_FD is edge-triggered, so an operation on a socket (a read, a send, asking its
    state) may take the edge of a message that arrived meanwhile, and such a socket is asked before the next
    wait.
    """

    def __init__(self) -> None:
        self._poll = select.poll()
        self._sockets_by_fd: dict[int, zmq.Socket[bytes]] = {}
        self._to_ask: set[zmq.Socket[bytes]] = set()

    def add_socket(self, sock: zmq.Socket[bytes]) -> None:
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._sockets_by_fd[fd] = sock
        self._poll.register(fd, select.POLLIN)
        self._to_ask.add(sock)

    def add_fd(self, fd: int) -> None:
        self._poll.register(fd, select.POLLIN)

    def remove_fd(self, fd: int) -> None:
        self._poll.unregister(fd)

    def used(self, *socks: zmq.Socket[bytes]) -> None:
        """The loop read from, wrote to or asked these sockets: ask them before the next wait."""
        self._to_ask.update(socks)

    def used_all(self) -> None:
        self._to_ask.update(self._sockets_by_fd.values())

    def poll(self, timeout_ms: int) -> tuple[list[zmq.Socket[bytes]], set[int]]:
        """Wait up to `timeout_ms` (negative: no limit) for a message on a socket or a readable (or failed)
        descriptor; the sockets with a message waiting and the descriptors, both empty after a timeout."""
        deadline_s = time.monotonic() + timeout_ms / 1e3
        sockets_by_fd = self._sockets_by_fd
        while True:
            to_ask = self._to_ask
            ready = [sock for sock in to_ask if _readable(sock)] if to_ask else []
            to_ask.clear()
            fired = self._poll.poll(0 if ready else timeout_ms)
            fds: set[int] = set()
            for fd, _events in fired:
                sock = sockets_by_fd.get(fd)
                if sock is None:
                    fds.add(fd)
                elif sock not in ready and _readable(sock):
                    ready.append(sock)
            if ready or fds or not fired or timeout_ms == 0:
                return ready, fds
            if timeout_ms > 0:  # only a socket's own bookkeeping woke it: wait for the rest
                timeout_ms = max(0, round((deadline_s - time.monotonic()) * 1e3))


@dataclass(frozen=True)
class IpcSettings:
    runtime_dir: Path
    max_frame_bytes: int
    limits: ConnectionLimits = DEFAULT_LIMITS
    protocol_minor: int = PROTOCOL_MINOR
    """The newest minor the daemon speaks: newer message types and fields are refused as unknown."""
    seqpacket_events: bool = True
    """Serve the SOCK_SEQPACKET event socket (minor 10 and later)."""
    carry_events: bool = True
    """Tell clients on it which events may wait for the next one (minor 11 on, `switching.carrying`)."""


class IpcServer:
    """Owns the ZeroMQ context and sockets; all on the daemon's main thread."""

    def __init__(self, core: DaemonCore, policy: AccessPolicy, settings: IpcSettings) -> None:
        self._core = core
        self._policy = policy
        self._settings = settings
        self._max_frame_bytes = settings.max_frame_bytes
        self._minor = settings.protocol_minor
        self._log = RateLimitedLog()
        self._callers: dict[str, Caller | None] = {}
        self._ctx = zmq.Context()
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.bind(ZAP_ENDPOINT)
        self._control = self._router(CONTROL_DOMAIN)
        self._admin = self._router(ADMIN_DOMAIN)
        self._events = self._ctx.socket(zmq.PULL)
        self._secure(self._events, CONTROL_DOMAIN)
        self._events.setsockopt(zmq.RCVHWM, EVENT_RCVHWM)
        self.connections = ConnectionBook(settings.limits, lambda: core.session_count)
        core.connections_from(lambda: (self.connections.live, self.connections.refused))
        self._monitors: list[zmq.Socket[bytes]] = []
        self._poller = SocketPoller()
        self._polled_pidfds: set[int] = set()
        self._pidfds_seen: tuple[int, ...] = ()
        self._extra_fds: dict[int, Callable[[], None]] = {}
        self._seqpacket: SeqpacketEvents | None = None
        self._deferred = DeferredReplies()
        self.add_fd(self._deferred.fd, self._deferred.serve)

    def _router(self, domain: bytes) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._secure(sock, domain)
        return sock

    @staticmethod
    def _secure(sock: zmq.Socket[bytes], domain: bytes) -> None:
        sock.setsockopt(zmq.ZAP_DOMAIN, domain)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, HARD_MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.LINGER, 0)

    # ------------------------------------------------------------------ setup

    def bind(self) -> None:
        """Reclaim stale socket files and bind the three sockets (call with the daemon lock held)."""
        runtime_dir = self._settings.runtime_dir
        plan = (
            (self._control, CONTROL_SOCKET_NAME, self._policy.socket_gid),
            (self._events, EVENT_SOCKET_NAME, self._policy.socket_gid),
            (self._admin, ADMIN_SOCKET_NAME, self._policy.admin_gid),
        )
        for sock, name, gid in plan:
            path = runtime_dir / name
            reclaim_stale_socket(path)
            old_umask = os.umask(0o117)
            try:
                sock.bind(f"ipc://{path}")
            finally:
                os.umask(old_umask)
            os.chmod(path, SOCKET_MODE)
            set_group(path, gid)
        for sock in (self._control, self._events, self._admin):
            monitor = sock.get_monitor_socket(MONITORED_EVENTS)
            self._monitors.append(monitor)
            self._poller.add_socket(monitor)
        for sock in (self._zap, self._control, self._events, self._admin):
            self._poller.add_socket(sock)
        if self._settings.seqpacket_events and self._minor >= SEQPACKET_SINCE:
            self._bind_seqpacket(runtime_dir / SEQPACKET_EVENT_SOCKET_NAME)

    def _bind_seqpacket(self, path: Path) -> None:
        listener = SeqpacketListener(path, self._policy.socket_gid)
        handlers = SeqpacketHandlers(
            may_connect=lambda caller: self._may_use(caller, admin=False),
            frame=self._datagram,
            oversized=self._oversized,
            requests_waiting=self._requests_waiting,
            warn=self._log.warning,
        )
        self._seqpacket = SeqpacketEvents(
            listener,
            self.connections,
            self._poller,
            handlers,
            batch=EVENT_BATCH,
            check_every=REQUEST_CHECK_EVENTS,
        )
        self._core.advertise_event_socket(SEQPACKET_EVENT_SOCKET_NAME)

    @property
    def seqpacket_socket(self) -> str | None:
        """The SOCK_SEQPACKET event socket's name, when it is served (`hello_ok`'s `event_socket`)."""
        return SEQPACKET_EVENT_SOCKET_NAME if self._seqpacket is not None else None

    def add_fd(self, fd: int, callback: Callable[[], None]) -> None:
        """Poll a plain file descriptor too (the signal wake-up pipe)."""
        self._extra_fds[fd] = callback
        self._poller.add_fd(fd)

    def set_max_frame_bytes(self, max_frame_bytes: int) -> None:
        self._max_frame_bytes = max_frame_bytes

    def close(self) -> None:
        if self._seqpacket is not None:
            self._seqpacket.close()
            self._seqpacket = None
            self._core.advertise_event_socket(None)
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._deferred.close()
        for path in (CONTROL_SOCKET_NAME, EVENT_SOCKET_NAME, ADMIN_SOCKET_NAME):
            (self._settings.runtime_dir / path).unlink(missing_ok=True)
        self._ctx.destroy(linger=0)

    # ------------------------------------------------------------------ loop

    def poll_once(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` and serve whatever is ready; whether that was events and nothing else (no
        request, connection, process death or signal, and not a timeout)."""
        self._sync_pidfds()
        ready, fds = self._poller.poll(timeout_ms)
        seqpacket = self._seqpacket
        if not ready and fds and seqpacket is not None and seqpacket.owns(fds):
            seqpacket.serve(fds)  # the hot path of minor 10: datagrams (or a new connection), nothing else
            if self._core.carry_waiting():  # a step's end switched a plan
                self._send_carries()
            if self._deferred.waiting:  # a reply whose GPU is stuck in a call: sent when its wait is over
                self._deferred.send_ready()
            return seqpacket.listen_fd not in fds
        if not fds and len(ready) == 1 and ready[0] is self._events:  # the hot path: an event
            self._drain_events()
            self._poller.used(self._events)
            if self._deferred.waiting:
                self._deferred.send_ready()
            return True
        self._poller.used_all()  # whatever is served below may use any socket (replies, monitors, ZAP)
        for monitor in self._monitors:
            if monitor in ready:
                self._serve_monitor(monitor)
        for fd in self._polled_pidfds & fds:
            self._core.pidfd_readable(fd)
        if self._zap in ready:
            self._serve_zap()
        if self._control in ready:  # requests before events: a flood of events never delays a status
            self._serve_router(self._control, admin=False)
        if self._admin in ready:
            self._serve_router(self._admin, admin=True)
        if self._events in ready:
            self._drain_events()
        if seqpacket is not None and fds:
            seqpacket.serve(fds)
        for fd, callback in self._extra_fds.items():
            if fd in fds:
                callback()
        if self._core.carry_waiting():
            self._send_carries()
        self._deferred.send_ready()
        return False

    def _send_carries(self) -> None:
        """Tell each client whose GPUs' carried events changed (a plan set or dropped); none are told when
        carrying is off."""
        seqpacket, carries = self._seqpacket, self._core.take_carries()
        if seqpacket is None or not self._carrying:
            return
        for pid, message in carries:
            seqpacket.send_to(pid, encode(message, minor=self._minor))

    @property
    def _carrying(self) -> bool:
        return self._settings.carry_events and self._minor >= CARRY_SINCE

    def _sync_pidfds(self) -> None:
        pidfds = self._core.client_pidfds()
        if pidfds == self._pidfds_seen:  # every wake-up asks; the set changes with sessions only
            return
        self._pidfds_seen = pidfds
        current = set(pidfds)
        for fd in self._polled_pidfds - current:
            self._poller.remove_fd(fd)
        for fd in current - self._polled_pidfds:
            self._poller.add_fd(fd)
        self._polled_pidfds = current

    # ------------------------------------------------------------------ connections

    def _serve_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        """Count connections as they come and go; shut down those over a limit (docs/daemon.md, Limits)."""
        book = self.connections
        for _ in range(1024):
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                uid = peer_uid(fd)
                reason = book.accepted(fd, uid)
                if reason is not None:
                    shut_down(fd)
                    self._log.warning("conn-limit", "refused a connection (uid %s): %s", uid, reason)
            else:
                book.closed(fd)

    # ------------------------------------------------------------------ ZAP

    def _serve_zap(self) -> None:
        while True:
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(request) < 6:
                continue
            version, request_id, domain, address = request[0], request[1], request[2], request[3]
            caller = parse_peer_address(address.decode(errors="replace"))
            allowed = self._may_use(caller, admin=domain == ADMIN_DOMAIN)
            if not allowed:
                self._core.count_auth_rejected()
                self._log.warning(
                    "zap", f"refused connection from {address.decode(errors='replace')} ({domain!r})"
                )
            status = (b"200", b"OK") if allowed else (b"400", b"not allowed")
            self._zap.send_multipart([version, request_id, *status, b"", b""])

    # ------------------------------------------------------------------ control and admin

    def _serve_router(self, sock: zmq.Socket[bytes], *, admin: bool) -> None:
        for _ in range(256):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 2:
                self._reply(
                    sock, frames[0].bytes, 0, self._error(ErrorCode.BAD_FRAME, "send exactly one frame")
                )
                continue
            routing_id, payload = frames[0].bytes, frames[1]
            data = payload.bytes
            request_id, reply, major, minor = self._answer(
                self._caller(str(payload.get("Peer-Address"))), data, admin=admin
            )
            if isinstance(reply, Deferred):  # sent once the GPUs answered; the loop serves on meanwhile
                send = partial(self._send_deferred, sock, routing_id, request_id, reply, major, minor)
                self._deferred.add(reply, send)
            else:
                self._reply(sock, routing_id, request_id, reply, major, minor)

    def _send_deferred(
        self,
        sock: zmq.Socket[bytes],
        routing_id: bytes,
        request_id: int,
        deferred: Deferred,
        major: int,
        minor: int,
    ) -> None:
        try:
            reply = deferred.finish()
        except Exception as exc:
            reply = self._failed(exc)
            major, minor = PROTOCOL_MAJOR, 0
        self._reply(sock, routing_id, request_id, reply, major, minor)

    def _answer(
        self, caller: Caller | None, data: bytes, *, admin: bool
    ) -> tuple[int, Message | Deferred, int, int]:
        """The request id, the reply (an `ErrorReply` for anything rejected) and the major and minor to write
        it in; never raises.

        A reply is written in the request's minor when that is older than the daemon's (the requester does
        not know the newer fields); an error in the request's major, so that a client of any version reads
        why it was refused. The frame is parsed once: a frame that fails to decode names its request id and
        major in the error.
        """
        request_id = 0
        try:
            frame = self._decode_request(caller, data, admin=admin)
            request_id = frame.request_id
            reply = self._dispatch(caller, frame, admin=admin)
            return request_id, reply, PROTOCOL_MAJOR, min(frame.minor, self._minor)
        except ProtocolError as exc:
            reply = self._error(exc.code, exc.message)
            request_id = request_id or exc.request_id
            if exc.frame_major is not None and 0 <= exc.frame_major <= MAX_ECHOED_MAJOR:
                return request_id, reply, exc.frame_major, 0
        except Exception as exc:
            reply = self._failed(exc)
        return request_id, reply, PROTOCOL_MAJOR, 0

    def _failed(self, exc: Exception) -> ErrorReply:
        """The error reply to a request whose handling raised `exc` (logged when it is not a domain error)."""
        if isinstance(exc, ProtocolError):
            return self._error(exc.code, exc.message)
        mapped = protocol_error(exc) if isinstance(exc, PerseusError) else None
        if mapped is not None:  # an event's domain error (requests map theirs in the core)
            return self._error(mapped.code, mapped.message)
        logger.exception("internal error handling a request")
        return self._error(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])

    def _may_use(self, caller: Caller | None, *, admin: bool) -> bool:
        """Authorisation by socket, the one place: the admin socket admits admins, the control and event
        sockets whoever may connect. Asked when a connection is made (ZAP) and again for every request (a
        SIGHUP may have changed the groups since)."""
        if caller is None:
            return False
        return self._policy.is_admin(caller) if admin else self._policy.may_connect(caller)

    def _decode_request(self, caller: Caller | None, data: bytes, *, admin: bool) -> Frame:
        if not self._may_use(caller, admin=admin):
            raise ProtocolError(ErrorCode.PERMISSION_DENIED, "caller not allowed")
        return decode(data, self._max_frame_bytes, self._minor)

    def _dispatch(self, caller: Caller | None, frame: Frame, *, admin: bool) -> Message | Deferred:
        assert caller is not None  # checked by _decode_request
        allowed = ADMIN_TYPES if admin else REQUEST_TYPES
        if type(frame.message) not in allowed:
            if not admin and type(frame.message) in ADMIN_TYPES:
                raise ProtocolError(ErrorCode.PERMISSION_DENIED, "admin requests go to the admin socket")
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{frame.message.TYPE} is not accepted here")
        if type(frame.message) in EVENT_TYPES:
            core = self._core
            core.count_received()
            try:
                core.deliver_event(caller, frame.message)
            except Exception:
                core.count_dropped(caller.pid)  # the error reply counts its code
                raise
            return EventAck()
        return self._core.handle(caller, frame.message, admin_socket=admin)

    def _error(self, code: ErrorCode, message: str) -> ErrorReply:
        self._core.count_rejected(code)
        self._log.warning(code, "request rejected: %s: %s", code, message)
        return ErrorReply(code=code.value, message=message)

    def _reply(
        self,
        sock: zmq.Socket[bytes],
        routing_id: bytes,
        request_id: int,
        reply: Message,
        major: int = PROTOCOL_MAJOR,
        minor: int = 0,
    ) -> None:
        """Send `reply` written in `major`.`minor` (an error reply in minor 0: the same in every version)."""
        try:
            data = encode(reply, request_id, 0 if isinstance(reply, ErrorReply) else minor, major=major)
        except ValueError as exc:  # a NaN or infinity in a reply: never send non-standard JSON
            logger.error("reply %s not encodable: %s", reply.TYPE, exc)
            data = encode(self._error(ErrorCode.INTERNAL, f"{reply.TYPE} reply not encodable"), request_id)
        try:
            sock.send_multipart([routing_id, data], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client went away or is not reading: drop the reply
            self._log.warning("reply", f"reply dropped: {exc}")

    # ------------------------------------------------------------------ events (hot path: no logging)

    def _drain_events(self) -> None:
        """Read up to EVENT_BATCH events; whatever a frame holds, it is counted and never raises.

        A frame from a process that holds no lease (typically the backlog of a lease just released) is
        dropped unread: counted as NOT_LEASED, as decoding it would end, at a small fraction of the cost.
        """
        sock = self._events
        count_received = self._core.count_received
        event_frame = self._event_frame
        for count in range(EVENT_BATCH):
            if count:  # the poll said the first is there; ask before the others (cheaper than zmq.Again)
                if not _readable(sock):
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

    def _datagram(self, caller: Caller, data: bytes) -> int:
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
            message = decode_event(data, self._max_frame_bytes, self._minor)
            if type(message) not in EVENT_TYPES:
                self._stream_frame(caller, message)
                return
            core.deliver_event(caller, message)
        except ProtocolError as exc:
            self._drop_event(caller, exc.code, exc.message)
        except Exception as exc:  # a bad frame never takes the daemon down
            self._drop_event(caller, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _oversized(self, caller: Caller, length: int) -> None:
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
            if self._seqpacket is not None and self._carrying:
                for carry in told:
                    self._seqpacket.send_to(caller.pid, encode(carry, minor=self._minor))
        else:
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{message.TYPE} is not an event")

    def _requests_waiting(self) -> bool:
        """Whether a request (or a new connection's ZAP handshake) is ready: served before more events."""
        self._poller.used(self._zap, self._control, self._admin)  # asked: their edges may be gone
        return _readable(self._zap) or _readable(self._control) or _readable(self._admin)

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

    def _caller(self, address: str | None) -> Caller | None:
        if address is None:
            return None
        caller = self._callers.get(address, ...)
        if caller is ...:
            if len(self._callers) > 4096:
                self._callers.clear()
            caller = parse_peer_address(address)
            self._callers[address] = caller
        return caller


def _readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits on `sock` (one getsockopt: no exception as `zmq.Again` raises)."""
    flags = sock.getsockopt(zmq.EVENTS)
    return isinstance(flags, int) and bool(flags & _POLLIN)

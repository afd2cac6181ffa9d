"""ZeroMQ transport: sockets, ZAP authentication, the poll loop.

Three `ipc://` sockets in the runtime directory: a control ROUTER (request/reply, DEALER clients), an event
PULL (fire-and-forget begin/end events) and an admin ROUTER; beside them the SOCK_SEQPACKET event socket of
protocol 6.10 (`perseusd.daemon.seqpacket`), polled in the same poll(2). A ZAP handler admits connections by
the peer's kernel credentials (SO_PEERCRED, `localhost:uid:gid:pid`), and every message is attributed to the
caller from its frame's `Peer-Address`, never from the request. Client pidfds are polled with the sockets.

The IPC layer is this module and the three it drives, the only modules of the daemon that import zmq: the
poller (`perseusd.daemon.socket_poller`), the requests of the control and admin sockets
(`perseusd.daemon.request_server`) and the stream of both event sockets (`perseusd.daemon.event_intake`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq
from perseus_client.protocol import (
    ADMIN_SOCKET_NAME,
    CONTROL_SOCKET_NAME,
    EVENT_SOCKET_NAME,
    PROTOCOL_MINOR,
    SEQPACKET_EVENT_SOCKET_NAME,
    Carry,
    encode,
)
from zmq.utils.monitor import parse_monitor_message

from perseusd.daemon.access import AccessPolicy
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.deferred import DeferredReplies
from perseusd.daemon.event_intake import EVENT_BATCH, REQUEST_CHECK_EVENTS, EventIntake
from perseusd.daemon.limits import ConnectionBook, ConnectionLimits, peer_uid, shut_down
from perseusd.daemon.rate_limited_log import RateLimitedLog
from perseusd.daemon.request_server import RequestServer
from perseusd.daemon.runtime_dir import SOCKET_MODE, reclaim_stale_socket, set_group
from perseusd.daemon.seqpacket import SeqpacketEvents, SeqpacketHandlers, SeqpacketListener
from perseusd.daemon.socket_poller import SocketPoller, readable
from perseusd.leasing.identity import Caller, parse_peer_address

logger = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
CONTROL_DOMAIN = b"perseus"
ADMIN_DOMAIN = b"perseus-admin"
HARD_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
EVENT_RCVHWM = 500
"""Events queued per client in the daemon: with the client's own queue (500 and a 64 KiB socket buffer), a
flood leaves about 1,300 events per client to drain, so the events of a released lease stop costing work at
once and memory stays flat; a client that sends faster than the daemon reads finds its queue full and counts
the drops."""
SEQPACKET_SINCE = 10
"""The minor whose daemons serve the SOCK_SEQPACKET event socket (`hello_ok`'s `event_socket`)."""
CARRY_SINCE = Carry.SINCE
"""The minor whose daemons tell clients which events may wait (`perseusd.switching.carrying`)."""
DEFAULT_LIMITS = ConnectionLimits.for_descriptors(1024)
MONITORED_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


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
        self._minor = settings.protocol_minor
        self._log = RateLimitedLog(logger)
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
        self._requests = RequestServer(
            core,
            policy,
            self._log,
            self._deferred,
            self._caller,
            max_frame_bytes=settings.max_frame_bytes,
            minor=self._minor,
        )
        self._intake = EventIntake(
            core,
            self._events,
            self._log,
            self._caller,
            self._requests_waiting,
            self._tell_carries,
            max_frame_bytes=settings.max_frame_bytes,
            minor=self._minor,
        )

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
            may_connect=lambda caller: self._requests.may_use(caller, admin=False),
            frame=self._intake.datagram,
            oversized=self._intake.oversized,
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
        self._requests.max_frame_bytes = max_frame_bytes
        self._intake.max_frame_bytes = max_frame_bytes

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
            self._intake.drain()
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
            self._requests.serve(self._control, admin=False)
        if self._admin in ready:
            self._requests.serve(self._admin, admin=True)
        if self._events in ready:
            self._intake.drain()
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
        self._tell_carries(self._core.take_carries())

    def _tell_carries(self, carries: Iterable[tuple[int, Carry]]) -> None:
        """Send each (pid, message) on the SOCK_SEQPACKET socket; none when carrying is off."""
        seqpacket = self._seqpacket
        if seqpacket is None or not self._carrying:
            return
        for pid, message in carries:
            seqpacket.send_to(pid, encode(message, minor=self._minor))

    def _requests_waiting(self) -> bool:
        """Whether a request (or a new connection's ZAP handshake) is ready: served before more events."""
        self._poller.used(self._zap, self._control, self._admin)  # asked: their edges may be gone
        return readable(self._zap) or readable(self._control) or readable(self._admin)

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
            allowed = self._requests.may_use(caller, admin=domain == ADMIN_DOMAIN)
            if not allowed:
                self._core.count_auth_rejected()
                self._log.warning(
                    "zap", f"refused connection from {address.decode(errors='replace')} ({domain!r})"
                )
            status = (b"200", b"OK") if allowed else (b"400", b"not allowed")
            self._zap.send_multipart([version, request_id, *status, b"", b""])

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

"""Requests on the control and admin sockets: authorise, decode, call the core, encode and send the reply.

Part of the IPC layer (`perseusd.daemon.ipc`, which owns the sockets and the loop). Each request is
authorised by the socket it came on and its sender's kernel credentials, then handed to the core; whatever
it holds, it gets one reply: the core's, sent now or once the GPUs answered (`perseusd.daemon.deferred`),
or an `ErrorReply` written so that a client of any version reads why it was refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import zmq
from perseus_client.protocol import (
    ADMIN_TYPES,
    EVENT_TYPES,
    PROTOCOL_MAJOR,
    REQUEST_TYPES,
    ErrorCode,
    ErrorReply,
    EventAck,
    Frame,
    Message,
    ProtocolError,
    decode,
    encode,
)

from perseusd.daemon.access import AccessPolicy
from perseusd.daemon.core import DaemonCore
from perseusd.daemon.deferred import Deferred, DeferredReplies
from perseusd.daemon.rate_limited_log import RateLimitedLog
from perseusd.daemon.wire_errors import protocol_error
from perseusd.errors import PerseusError
from perseusd.leasing.identity import Caller

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 400
MAX_ECHOED_MAJOR = (1 << 31) - 1


class RequestServer:
    """Serves the ROUTER sockets' requests; `caller` attributes a frame's `Peer-Address` to its sender."""

    def __init__(
        self,
        core: DaemonCore,
        policy: AccessPolicy,
        log: RateLimitedLog,
        deferred: DeferredReplies,
        caller: Callable[[str | None], Caller | None],
        *,
        max_frame_bytes: int,
        minor: int,
    ) -> None:
        self._core = core
        self._policy = policy
        self._log = log
        self._deferred = deferred
        self._caller = caller
        self.max_frame_bytes = max_frame_bytes
        """The longest frame decoded (a SIGHUP may change it)."""
        self._minor = minor

    def serve(self, sock: zmq.Socket[bytes], *, admin: bool) -> None:
        """Answer up to 256 requests waiting on `sock` (the admin socket's when `admin`)."""
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

    def may_use(self, caller: Caller | None, *, admin: bool) -> bool:
        """Authorisation by socket, the one place: the admin socket admits admins, the control and event
        sockets whoever may connect. Asked when a connection is made (ZAP) and again for every request (a
        SIGHUP may have changed the groups since)."""
        if caller is None:
            return False
        return self._policy.is_admin(caller) if admin else self._policy.may_connect(caller)

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

    def _decode_request(self, caller: Caller | None, data: bytes, *, admin: bool) -> Frame:
        if not self.may_use(caller, admin=admin):
            raise ProtocolError(ErrorCode.PERMISSION_DENIED, "caller not allowed")
        return decode(data, self.max_frame_bytes, self._minor)

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

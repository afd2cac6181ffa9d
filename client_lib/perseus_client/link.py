"""The client's control link: one request, one reply, a deadline, and errors that name their cause.

`request_reply` sends a request on the client's DEALER socket and waits for the reply with the same id. When
the daemon cannot be reached, the error says why (`perseus_client.reach.diagnose`): no permission (which
group, which socket), daemon not running, wrong runtime directory, or not answering; a daemon of another
protocol major answers `VERSION_MISMATCH` naming the side to upgrade.
"""

from __future__ import annotations

import os
import struct
import time
from typing import TYPE_CHECKING, Protocol, TypeVar

import zmq

from perseus_client import reach
from perseus_client.envelope import CONTROL_SOCKET_NAME, DEFAULT_MAX_FRAME_BYTES, MINOR_REFUSED
from perseus_client.protocol import ErrorReply, Message, ProtocolError, decode_reply, encode
from perseus_client.version import PROTOCOL_MINOR

if TYPE_CHECKING:
    from pathlib import Path

M = TypeVar("M", bound=Message)


class PerseusClientError(Exception):
    """A control call failed. `code` is the daemon's stable error code, or UNREACHABLE / NOT_CONNECTED
    (PERMISSION_DENIED too when the daemon refused this user at connect).

    `reached`: whether the daemon answered (False: the call never got to it).
    """

    def __init__(self, code: str, message: str, *, reached: bool = True) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reached = reached

    @property
    def lost_link(self) -> bool:
        """The daemon is out of reach for this client as a whole (not a refusal of one request)."""
        return not self.reached or self.code == "VERSION_MISMATCH"


class LinkOwner(Protocol):
    """What the link needs of its client: the minor to write, where the daemon is, its refusal at connect."""

    protocol_minor: int
    runtime_dir: Path
    auth_failed: bool


def request_reply(
    sock: zmq.Socket[bytes],
    request: Message,
    expected: type[M],
    *,
    timeout_s: float,
    request_id: int,
    client: LinkOwner | None = None,
) -> M:
    """Send one request on a DEALER socket and wait for its reply; raises `PerseusClientError`.

    The request is written in the client's minor (`PerseusClient.protocol_minor`, else the newest). A daemon
    of protocol 6 as first released refuses the minor field "m" itself: the request is then sent again in
    minor 0, and the client keeps to it.
    """
    deadline_s = time.monotonic() + timeout_s
    minor = client.protocol_minor if client is not None else PROTOCOL_MINOR
    try:
        return _exchange(sock, request, expected, deadline_s, timeout_s, request_id, client, minor)
    except PerseusClientError as exc:
        if minor == 0 or exc.code != "BAD_FIELD" or not exc.message.endswith(MINOR_REFUSED):
            raise
    if client is not None:
        client.protocol_minor = 0
    return _exchange(sock, request, expected, deadline_s, timeout_s, request_id, client, 0)


def _exchange(
    sock: zmq.Socket[bytes],
    request: Message,
    expected: type[M],
    deadline_s: float,
    timeout_s: float,
    request_id: int,
    client: LinkOwner | None,
    minor: int,
) -> M:
    if not sock.poll(max(0, int((deadline_s - time.monotonic()) * 1000)), zmq.POLLOUT):
        raise unreachable(client, sock, f"the daemon is not reachable at {_endpoint(sock)}")
    sock.send(encode(request, request_id, minor, keep_newer_values=True), zmq.NOBLOCK)
    while True:
        left_ms = int((deadline_s - time.monotonic()) * 1000)
        if left_ms <= 0 or not sock.poll(left_ms, zmq.POLLIN):
            raise unreachable(
                client, sock, f"no reply to {request.TYPE} within {timeout_s:g} s from {_endpoint(sock)}"
            )
        try:
            frame = decode_reply(sock.recv(zmq.NOBLOCK), 64 * DEFAULT_MAX_FRAME_BYTES)
        except ProtocolError as exc:
            raise PerseusClientError(exc.code, f"bad reply from the daemon: {exc.message}") from None
        if frame.request_id != request_id:
            continue  # a late reply to an earlier, timed-out request
        if isinstance(frame.message, ErrorReply):
            raise PerseusClientError(frame.message.code, frame.message.message)
        if not isinstance(frame.message, expected):
            raise PerseusClientError("BAD_FRAME", f"unexpected reply {frame.message.TYPE}")
        return frame.message


def _endpoint(sock: zmq.Socket[bytes]) -> str:
    """The socket path a client socket connects to (for error messages)."""
    try:
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    except zmq.ZMQError:
        endpoint = ""
    return endpoint.removeprefix("ipc://") or "the daemon's control socket"


def unreachable(
    client: LinkOwner | None, sock: zmq.Socket[bytes] | None, fallback: str
) -> PerseusClientError:
    """The error of a call that did not reach the daemon, naming the cause where it can be told."""
    if client is None:
        return PerseusClientError("UNREACHABLE", fallback, reached=False)
    path = os.path.join(client.runtime_dir, CONTROL_SOCKET_NAME)
    if client.auth_failed:
        return PerseusClientError("PERMISSION_DENIED", reach.refused_by_daemon(path).message, reached=False)
    cause = reach.diagnose(str(client.runtime_dir), CONTROL_SOCKET_NAME)
    message = fallback if isinstance(cause, reach.NotAnswering) and sock is not None else cause.message
    return PerseusClientError(cause.code, message, reached=False)


def monitor_event(frames: list[bytes]) -> int:
    """The event number of a ZeroMQ socket-monitor message (first frame: uint16 event, uint32 value).

    Parsed here rather than with `zmq.utils.monitor`, which imports asyncio: that costs every short-lived
    caller (perseusctl), and a process that dropped privileges may no longer be able to import it.
    """
    event: int = struct.unpack_from("=H", frames[0])[0]
    return event

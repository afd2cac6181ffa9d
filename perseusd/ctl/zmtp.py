"""One request and its reply on a daemon's ZeroMQ socket, with the standard library only (ZMTP 3.0).

perseusctl asks one question and exits, so pyzmq's import (about a third of a short command's run) buys it
nothing. This speaks just what a DEALER needs with the daemon's ROUTER over `ipc://`: the greeting, the NULL
handshake (the daemon's ZAP handler admits or refuses the kernel-attested caller, as for any client), one
message out and one back. Training processes keep using pyzmq (`perseus_client.client`). Spec: ZMTP 3.0,
https://rfc.zeromq.org/spec/23/.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pathlib is not imported at run time: `perseusctl status` pays for every import
    from os import PathLike

SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"
GREETING = SIGNATURE + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
"""Signature, version 3.0, mechanism NULL, as-server 0, filler: 64 bytes."""
GREETING_BYTES = 64
FLAG_MORE = 0x01
FLAG_LONG = 0x02
FLAG_COMMAND = 0x04
MAX_REPLY_BYTES = 64 << 20
"""A frontier document of a large job is megabytes; anything far beyond is not a reply. The cap is on
everything the peer sends for one request (frames of a multi-frame reply, heartbeats), not on one frame."""
READ_CHUNK_BYTES = 1 << 20


class ZmtpUnreachableError(Exception):
    """The socket does not answer as a ZeroMQ peer (no daemon, a dead one, or a timeout)."""


class ZmtpRefusedError(Exception):
    """The daemon's handshake refused this caller (its ZAP handler: not in the allowed groups)."""


class _ClosedError(Exception):
    """The peer closed the connection."""


def request(path: str | PathLike[str], payload: bytes, timeout_s: float) -> bytes:
    """Send `payload` as one message to the ROUTER socket at `path`; return the one message that comes back.

    Raises `ZmtpUnreachableError` (connection failed, timed out or closed) or `ZmtpRefusedError`.
    """
    deadline_s = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(os.fspath(path))
        except OSError as exc:
            raise ZmtpUnreachableError(
                f"the daemon is not reachable at {path} ({exc.strerror or exc})"
            ) from None
        link = _Link(sock, deadline_s, path)
        try:
            link.send(GREETING)
            greeting = link.read(GREETING_BYTES)
        except _ClosedError:
            raise ZmtpUnreachableError(
                f"the daemon is not reachable at {path} (it closed the connection)"
            ) from None
        if greeting[:1] != b"\xff" or greeting[9:10] != b"\x7f" or greeting[10] < 3:
            raise ZmtpUnreachableError(f"{path} did not greet as ZeroMQ 3")
        try:
            link.send(_frame(_ready(b"DEALER"), FLAG_COMMAND))
            _expect_ready(link)
        except _ClosedError:  # ZeroMQ may close without a word when its handshake refuses the caller
            raise ZmtpRefusedError("the daemon closed the connection during the handshake") from None
        try:
            link.send(_frame(payload, 0))
            return link.message()
        except _ClosedError:
            raise ZmtpUnreachableError(
                f"the daemon at {path} closed the connection before replying"
            ) from None
    finally:
        sock.close()


def _ready(socket_type: bytes) -> bytes:
    name = b"Socket-Type"
    return b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(socket_type)) + socket_type


def _frame(body: bytes, flags: int) -> bytes:
    if len(body) <= 255:
        return bytes([flags, len(body)]) + body
    return bytes([flags | FLAG_LONG]) + struct.pack(">Q", len(body)) + body


def _expect_ready(link: _Link) -> None:
    flags, body = link.frame()
    if not flags & FLAG_COMMAND:
        raise ZmtpUnreachableError(f"{link.path}: a message before the handshake")
    name = body[1 : 1 + body[0]] if body else b""
    if name == b"ERROR":
        reason = body[7 : 7 + body[6]].decode(errors="replace") if len(body) > 6 else ""
        raise ZmtpRefusedError(reason or "refused")
    if name != b"READY":
        raise ZmtpUnreachableError(f"{link.path}: unexpected handshake command {name!r}")


class _Link:
    """Reads and writes on the connected socket within the one deadline of the request."""

    def __init__(self, sock: socket.socket, deadline_s: float, path: str | PathLike[str]) -> None:
        self._sock = sock
        self._deadline_s = deadline_s
        self.path = path
        self._buffer = b""
        self._received = 0

    def _left_s(self) -> float:
        left_s = self._deadline_s - time.monotonic()
        if left_s <= 0:
            raise ZmtpUnreachableError(f"the daemon is not reachable at {self.path} (no reply in time)")
        return left_s

    def send(self, data: bytes) -> None:
        try:
            self._sock.settimeout(self._left_s())
            self._sock.sendall(data)
        except OSError as exc:
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> Exception:
        if isinstance(exc, BrokenPipeError | ConnectionResetError):
            return _ClosedError()
        reason = "no reply in time" if isinstance(exc, TimeoutError) else exc.strerror
        return ZmtpUnreachableError(f"the daemon is not reachable at {self.path} ({reason})")

    def read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            try:
                self._sock.settimeout(self._left_s())
                chunk = self._sock.recv(min(max(65536, count - len(self._buffer)), READ_CHUNK_BYTES))
            except OSError as exc:
                raise self._error(exc) from None
            if not chunk:
                raise _ClosedError
            self._received += len(chunk)
            if self._received > MAX_REPLY_BYTES + GREETING_BYTES + 1024:
                raise ZmtpUnreachableError(f"{self.path}: a reply larger than {MAX_REPLY_BYTES} bytes")
            self._buffer += chunk
        data, self._buffer = self._buffer[:count], self._buffer[count:]
        return data

    def frame(self) -> tuple[int, bytes]:
        flags = self.read(1)[0]
        size = struct.unpack(">Q", self.read(8))[0] if flags & FLAG_LONG else self.read(1)[0]
        if size > MAX_REPLY_BYTES:
            raise ZmtpUnreachableError(f"{self.path}: a frame of {size} bytes")
        return flags, self.read(size)

    def message(self) -> bytes:
        """The next message (its frames joined), skipping commands (heartbeats)."""
        parts: list[bytes] = []
        while True:
            flags, body = self.frame()
            if flags & FLAG_COMMAND:
                continue
            parts.append(body)
            if not flags & FLAG_MORE:
                return b"".join(parts)

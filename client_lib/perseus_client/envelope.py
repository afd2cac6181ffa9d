"""Frames on the wire: the envelope, its version, and the JSON under it (stdlib only).

A frame is one compact, standard JSON object ``{"v": MAJOR, "id": REQUEST_ID, "m": MINOR, "type": TYPE,
...fields}``; `"m"` is left out for minor 0. `perseus_client.protocol` holds the messages and binds these
functions to its registry (`protocol.encode`, `protocol.decode`, `protocol.decode_reply`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from perseus_client.codes import ErrorCode, ProtocolError
from perseus_client.message import Message
from perseus_client.validation import Schema, build
from perseus_client.version import PROTOCOL_MAJOR, PROTOCOL_MINOR, unsupported_major, version_text

DEFAULT_MAX_FRAME_BYTES = 1 << 20
CONTROL_SOCKET_NAME = "control.sock"
EVENT_SOCKET_NAME = "events.sock"
ADMIN_SOCKET_NAME = "admin.sock"
"""The daemon's sockets in its runtime directory."""
SEQPACKET_EVENT_SOCKET_NAME = "events.seqpacket"
"""The daemon's event socket of minor 10 (AF_UNIX, SOCK_SEQPACKET: one event frame a datagram), in its runtime
directory beside the others; advertised in `hello_ok`'s `event_socket`. A client opens this name in the
runtime directory it was given and no other path."""
MAX_REQUEST_ID = (1 << 63) - 1
MAX_MINOR = (1 << 31) - 1
MINOR_REFUSED = ": unexpected field(s) ['m']"
"""How a daemon that predates minors (protocol 6.0 as first released) ends its refusal of a frame's "m": a
client then asks again in minor 0 and keeps to it."""
ERROR_TYPE = "error"
"""The error reply's type: `{code, message}` in every version, decodable whatever its major."""


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """A decoded frame: the request id, the typed message, and the minor it was written in."""

    request_id: int
    message: Message
    minor: int = 0


# --------------------------------------------------------------------------------------------- encoding


def encode_frame(
    message: Message,
    request_id: int,
    minor: int,
    *,
    major: int = PROTOCOL_MAJOR,
    keep_newer_values: bool = False,
) -> bytes:
    """Encode a message as one compact, standard JSON frame written in protocol `major`.`minor`.

    Fields newer than `minor` are left out (a peer of that minor does not know them); with
    `keep_newer_values` only those still at their default are (a request: the peer then refuses a value it
    cannot honour rather than the sender losing it silently). Raises ValueError when a number is NaN or
    infinite: such a frame would be refused on the other side.
    """
    body: dict[str, Any] = {"v": major, "id": request_id}
    if minor > 0:
        body["m"] = minor
    body["type"] = message.TYPE
    if minor >= PROTOCOL_MINOR:
        body.update(dataclasses.asdict(message))
    else:
        body.update(_fields_for(message, minor, keep_newer_values))
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def _fields_for(obj: Any, minor: int, keep_newer_values: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("since", 0) > minor and not (keep_newer_values and value != f.default):
            continue
        fields[f.name] = _wire_value(value, minor, keep_newer_values)
    return fields


def _wire_value(value: Any, minor: int, keep_newer_values: bool) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields_for(value, minor, keep_newer_values)
    if isinstance(value, tuple | list):
        return [_wire_value(item, minor, keep_newer_values) for item in value]
    if isinstance(value, dict):
        return {key: _wire_value(item, minor, keep_newer_values) for key, item in value.items()}
    return value


# --------------------------------------------------------------------------------------------- decoding


def decode_frame(
    data: bytes,
    max_frame_bytes: int,
    types: Mapping[str, type[Message]],
    *,
    schema: Schema,
    peer: str,
    we_are: str,
) -> Frame:
    """Decode and validate one frame; raises `ProtocolError` with a stable code (and only that).

    `schema.strict`: unknown fields are refused (the daemon's requests) or ignored (the client's replies);
    message types and fields newer than `schema.minor` are unknown. An error reply is decoded whatever its
    major. `peer` and `we_are` name the two sides in a version mismatch ("the client", "perseusd").
    Nesting too deep for the parser, non-standard JSON (NaN, Infinity), numbers out of range and memory
    exhaustion are all BAD_FRAME or BAD_FIELD. The error carries the frame's request id once it is known
    (`ProtocolError.request_id`) and its major (`ProtocolError.frame_major`), so a reply can be addressed
    in a form the sender reads without parsing the frame a second time.
    """
    if len(data) > max_frame_bytes:
        error = ProtocolError(ErrorCode.TOO_LARGE, f"frame of {len(data)} bytes exceeds {max_frame_bytes}")
        error.request_id = _leading_id(data)
        raise error
    try:
        body = _parse_json(data)
    except ProtocolError as exc:
        exc.request_id = _leading_id(data)
        raise
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, "frame is not a JSON object")
    major = body.pop("v", None)
    if type(major) is not int:
        raise ProtocolError(ErrorCode.BAD_FRAME, "missing protocol version 'v'")
    request_id = body.pop("id", None)
    known_id = request_id if type(request_id) is int and 0 <= request_id <= MAX_REQUEST_ID else 0
    try:
        return _typed_frame(body, major, request_id, types, schema, peer, we_are)
    except ProtocolError as exc:
        exc.request_id = known_id
        exc.frame_major = major
        raise
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:  # never anything but ProtocolError
        error = ProtocolError(ErrorCode.BAD_FIELD, f"cannot validate the frame: {type(exc).__name__}")
        error.request_id = known_id
        error.frame_major = major
        raise error from None


def _typed_frame(
    body: dict[str, Any],
    major: int,
    request_id: Any,
    types: Mapping[str, type[Message]],
    schema: Schema,
    peer: str,
    we_are: str,
) -> Frame:
    msg_type = body.pop("type", None)
    if major != PROTOCOL_MAJOR and not (msg_type == ERROR_TYPE and not schema.strict):
        text = unsupported_major(major, schema.minor, we_are=we_are, they_are=peer)
        raise ProtocolError(ErrorCode.VERSION_MISMATCH, text)
    if type(request_id) is not int or not 0 <= request_id <= MAX_REQUEST_ID:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"missing or bad request id 'id' (0..{MAX_REQUEST_ID})")
    minor = body.pop("m", 0)
    if type(minor) is not int or not 0 <= minor <= MAX_MINOR:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"bad protocol minor 'm' (0..{MAX_MINOR})")
    cls = types.get(msg_type) if isinstance(msg_type, str) else None
    if cls is None or schema.minor < cls.SINCE:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, _unknown_type(msg_type, cls, minor, schema.minor, we_are))
    return Frame(request_id, build(cls, body, msg_type or "", schema), minor)


def _unknown_type(msg_type: Any, cls: type[Message] | None, minor: int, ours: int, we_are: str) -> str:
    text = f"unknown message type {_short(msg_type)}"
    newest = version_text(PROTOCOL_MAJOR, ours)
    speaks = f"{we_are} speaks {PROTOCOL_MAJOR}.0-{newest}: upgrade {we_are} for it"
    if cls is not None:  # known, but newer than the minor this side is set to speak
        return f"{text} (new in protocol {version_text(PROTOCOL_MAJOR, cls.SINCE)}; {speaks})"
    if minor > ours:
        return f"{text} (written in protocol {version_text(PROTOCOL_MAJOR, minor)}; {speaks})"
    return text


_LEADING_ID = rb'\A\{"v":\d{1,9},"id":(\d{1,18})[,}]'


def _leading_id(data: bytes) -> int:
    """The request id of a frame that cannot be parsed, when it starts as `encode` writes frames (else 0):
    a glance at its first bytes, never a second parse."""
    match = re.match(_LEADING_ID, data[:64])  # re caches the compiled pattern
    return int(match.group(1)) if match else 0


def _parse_json(data: bytes) -> Any:
    """The JSON value of a frame, standard JSON only (NaN and Infinity are refused)."""
    try:
        return _DECODER.decode(data.decode())
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError(ErrorCode.BAD_FRAME, "JSON nested too deeply") from None
    except MemoryError:
        raise ProtocolError(ErrorCode.TOO_LARGE, "frame too large to parse") from None
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"not a JSON frame: {_short(str(exc))}") from None


def _refuse_constant(name: str) -> Any:
    raise ProtocolError(ErrorCode.BAD_FRAME, f"non-standard JSON constant {name} (numbers must be finite)")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else f"{text[:limit]}..."

"""A frozen peer of protocol 6.0 (protocol 6 as first released): its encoder and its strict decoder.

Written from the released code and the schema it had (`protocol_6_0.json`, every message and nested
object with its exact field names), and independent of `perseus_client`: never edit it to follow newer
code. It encodes the way 6.0 did (no minor) and decodes the way 6.0 did: the major must be equal, the type
known, and every object's fields exactly those of 6.0, no more, no fewer; the error texts are 6.0's. It
stands for a training job whose client library is pinned at 6.0 and for a daemon that was never upgraded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA: dict[str, Any] = json.loads((Path(__file__).parent / "protocol_6_0.json").read_text())
MAJOR: int = SCHEMA["major"]
MINOR: int = SCHEMA["minor"]


class FrozenError(Exception):
    """What 6.0's decoder raised: a stable code and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def encode(msg_type: str, fields: dict[str, Any], request_id: int = 0) -> bytes:
    """A frame as 6.0 wrote it: `{"v": 6, "id": ..., "type": ..., ...}`, compact standard JSON."""
    body = {"v": MAJOR, "id": request_id, "type": msg_type, **fields}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def decode(data: bytes) -> tuple[int, str, dict[str, Any]]:
    """(request id, type, fields) of a frame, validated as 6.0 did; raises `FrozenError`."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise FrozenError("BAD_FRAME", f"not a JSON frame: {exc}") from None
    if not isinstance(body, dict):
        raise FrozenError("BAD_FRAME", "frame is not a JSON object")
    version = body.pop("v", None)
    if type(version) is not int:
        raise FrozenError("BAD_FRAME", "missing protocol version 'v'")
    request_id = body.pop("id", None)
    if version != MAJOR:
        raise FrozenError("VERSION_MISMATCH", f"protocol {version} not supported (this side speaks {MAJOR})")
    if type(request_id) is not int or request_id < 0:
        raise FrozenError("BAD_FRAME", "missing or bad request id 'id'")
    msg_type = body.pop("type", None)
    fields = SCHEMA["messages"].get(msg_type) if isinstance(msg_type, str) else None
    if fields is None:
        raise FrozenError("UNKNOWN_TYPE", f"unknown message type {msg_type!r}")
    _check(fields, body, str(msg_type))
    return request_id, str(msg_type), body


def _check(fields: dict[str, str | None], body: dict[str, Any], where: str) -> None:
    extra = set(body) - set(fields)
    if extra:
        raise FrozenError("BAD_FIELD", f"{where}: unexpected field(s) {sorted(extra)}")
    for name, obj in fields.items():
        if name not in body:
            raise FrozenError("BAD_FIELD", f"{where}: missing field '{name}'")
        if obj is not None:
            _check_nested(SCHEMA["objects"][obj], body[name], f"{where}.{name}")


def _check_nested(fields: dict[str, str | None], value: Any, where: str) -> None:
    """An object field, or a list of them (None allowed: optional objects; 6.0 had no map of objects)."""
    if value is None:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_nested(fields, item, f"{where}[{i}]")
    elif isinstance(value, dict):
        _check(fields, value, where)
    else:
        raise FrozenError("BAD_FIELD", f"{where}: expected an object")

"""(major, minor) without sockets: what each minor writes, strict requests and tolerant replies, majors that
differ, and what importing the protocol loads. Version numbers come from `perseus_client.version`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from dataclasses import dataclass
from typing import ClassVar

import pytest
from perseus_client import protocol as p
from perseus_client.envelope import decode_frame
from perseus_client.message import Message
from perseus_client.validation import Schema

NEXT = p.PROTOCOL_MINOR + 1
OLDER = p.PROTOCOL_MINOR - 1


@dataclass(frozen=True)
class FutureRequest(Message):
    """A request of a minor this library does not have yet."""

    TYPE: ClassVar[str] = "future_request"
    SINCE: ClassVar[int] = NEXT
    gpu: str


@dataclass(frozen=True)
class Grown(Message):
    """A message of minor 0 that gained a field in the newest minor."""

    TYPE: ClassVar[str] = "grown"
    gpu: str
    extra_w: float | None = p.since(p.PROTOCOL_MINOR, None)


TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (FutureRequest, Grown, p.ErrorReply)}


def _decode(data: bytes, *, strict: bool, minor: int) -> p.Frame:
    schema = Schema(strict=strict, minor=minor)
    return decode_frame(data, 1 << 20, TYPES, schema=schema, peer="the client", we_are="perseusd")


def test_each_minor_writes_only_the_fields_it_has() -> None:
    hello_ok = p.HelloOk("1", p.PROTOCOL_MAJOR, (), p.PROTOCOL_MINOR)
    newest = json.loads(p.encode(hello_ok, 4))
    assert newest["m"] == p.PROTOCOL_MINOR
    assert newest["protocol_minor"] == p.PROTOCOL_MINOR
    for minor in range(p.PROTOCOL_MINOR):
        body = json.loads(p.encode(hello_ok, 4, minor))
        since = {f.name: f.metadata.get("since", 0) for f in dataclasses.fields(p.HelloOk)}
        assert set(body) - {"v", "id", "m", "type"} == {name for name, s in since.items() if s <= minor}
        assert body.get("m", 0) == minor  # "m" left out for minor 0


def test_a_request_keeps_a_newer_field_only_when_it_is_set_and_a_reply_never() -> None:
    plain = json.loads(p.encode(Grown("GPU-a"), 1, OLDER, keep_newer_values=True))
    assert "extra_w" not in plain
    request = p.encode(Grown("GPU-a", 250.0), 1, OLDER, keep_newer_values=True)
    assert json.loads(request)["extra_w"] == 250.0  # the older peer refuses it: the value is never lost
    with pytest.raises(p.ProtocolError) as info:
        _decode(request, strict=True, minor=OLDER)
    assert info.value.code == p.ErrorCode.BAD_FIELD
    assert _decode(request, strict=True, minor=p.PROTOCOL_MINOR).message == Grown("GPU-a", 250.0)
    reply = json.loads(p.encode(Grown("GPU-a", 250.0), 1, OLDER))
    assert "extra_w" not in reply  # a reply to an older minor: its reader would not know the field


def test_no_message_is_newer_than_the_newest_minor() -> None:
    """What `PROTOCOL_MINOR` promises (and the encoder's fast path relies on): every registered message
    type, and every field of it or of the objects it holds, is of that minor or older."""
    seen: set[type] = set()

    def newest(cls: type) -> int:
        if cls in seen:
            return 0
        seen.add(cls)
        found = getattr(cls, "SINCE", 0)
        for f in dataclasses.fields(cls):
            found = max(found, f.metadata.get("since", 0))
            for inner in _dataclasses_in(typing.get_type_hints(cls)[f.name]):
                found = max(found, newest(inner))
        return found

    assert max(newest(cls) for cls in p.MESSAGE_TYPES.values()) <= p.PROTOCOL_MINOR


def _dataclasses_in(hint: object) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [inner for arg in typing.get_args(hint) for inner in _dataclasses_in(arg)]


def test_a_strict_decoder_refuses_types_newer_than_its_minor_and_says_who_upgrades() -> None:
    data = p.encode(FutureRequest("GPU-a"), 3, NEXT)
    assert json.loads(data)["m"] == NEXT
    with pytest.raises(p.ProtocolError) as info:
        _decode(data, strict=True, minor=p.PROTOCOL_MINOR)
    assert info.value.code == p.ErrorCode.UNKNOWN_TYPE
    assert info.value.request_id == 3
    assert f"new in protocol {p.PROTOCOL_MAJOR}.{NEXT}" in info.value.message
    assert "upgrade perseusd" in info.value.message
    assert _decode(data, strict=True, minor=NEXT).message == FutureRequest("GPU-a")
    unknown = json.dumps({"v": p.PROTOCOL_MAJOR, "id": 5, "m": NEXT, "type": "who_knows"}).encode()
    with pytest.raises(p.ProtocolError) as info:
        p.decode(unknown)
    assert info.value.code == p.ErrorCode.UNKNOWN_TYPE
    assert "upgrade perseusd" in info.value.message


def test_requests_stay_strict_and_replies_are_tolerant() -> None:
    body = {"v": p.PROTOCOL_MAJOR, "id": 2, "m": NEXT, "type": "grown", "gpu": "GPU-a", "extra_w": 1.5}
    with pytest.raises(p.ProtocolError) as info:
        _decode(json.dumps(body).encode(), strict=True, minor=OLDER)
    assert info.value.code == p.ErrorCode.BAD_FIELD
    tolerant = _decode(json.dumps(body).encode(), strict=False, minor=OLDER)
    assert tolerant == p.Frame(2, Grown("GPU-a"), NEXT)  # the newer field ignored
    nested = json.loads(p.encode(p.StatusReply(_health(), ()), 8))
    nested["daemon"]["from_a_newer_minor"] = {"any": ["thing"]}
    nested["new_top_level"] = 1
    assert p.decode_reply(json.dumps(nested).encode()).message == p.StatusReply(_health(), ())
    with pytest.raises(p.ProtocolError):
        p.decode(json.dumps(nested).encode())
    del nested["daemon"]["version"]  # a field every minor has: still required
    with pytest.raises(p.ProtocolError) as info:
        p.decode_reply(json.dumps(nested).encode())
    assert info.value.code == p.ErrorCode.BAD_FIELD


def test_a_reply_of_an_older_minor_takes_the_defaults() -> None:
    old = json.loads(p.encode(p.HelloOk("1", p.PROTOCOL_MAJOR, (), p.PROTOCOL_MINOR), 4, 0))
    assert p.decode_reply(json.dumps(old).encode()).message == p.HelloOk("1", p.PROTOCOL_MAJOR, ())


@pytest.mark.parametrize(("offset", "upgrade"), [(1, "upgrade this client"), (-1, "upgrade perseusd")])
def test_a_reply_of_another_major_is_refused_but_its_errors_are_read(offset: int, upgrade: str) -> None:
    major = p.PROTOCOL_MAJOR + offset
    status = json.dumps({"v": major, "id": 6, "type": "status_ok", "daemon": {}, "gpus": []}).encode()
    with pytest.raises(p.ProtocolError) as info:
        p.decode_reply(status)
    assert info.value.code == p.ErrorCode.VERSION_MISMATCH
    assert upgrade in info.value.message
    error = json.dumps({"v": major, "id": 6, "type": "error", "code": "LIMIT", "message": "m"}).encode()
    assert p.decode_reply(error) == p.Frame(6, p.ErrorReply("LIMIT", "m"))


def test_a_request_of_another_major_names_its_major_for_the_reply() -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode(json.dumps({"v": p.PROTOCOL_MAJOR + 1, "id": 12, "type": "status"}).encode())
    assert (info.value.code, info.value.request_id) == (p.ErrorCode.VERSION_MISMATCH, 12)
    assert info.value.frame_major == p.PROTOCOL_MAJOR + 1
    assert "upgrade perseusd" in info.value.message


def test_error_replies_never_grow() -> None:
    """Every version reads an error reply: {code, message} and nothing that could be newer."""
    fields = dataclasses.fields(p.ErrorReply)
    assert [f.name for f in fields] == ["code", "message"]
    assert all(f.metadata.get("since", 0) == 0 for f in fields)
    assert p.ErrorReply.SINCE == 0


def _health() -> p.DaemonHealth:
    return p.DaemonHealth("0.1", p.PROTOCOL_MAJOR, 5, 1.5, 2, 10, 1, {}, 0, 0, None, 0)


def test_importing_the_protocol_loads_neither_the_client_nor_zmq() -> None:
    """In a fresh interpreter: what `import perseus_client.protocol` loads, not what its source says."""
    code = (
        "import sys, json; before = set(sys.modules); import perseus_client.protocol; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(out.stdout))
    assert "perseus_client.protocol" in loaded
    assert not {m for m in loaded if m == "zmq" or m.startswith("zmq.")}
    assert not loaded & {"perseus_client.client", "perseus_client.connection", "perseus_client.event_sending"}
    outside = {m for m in loaded if m.split(".")[0] not in {"perseus_client", *sys.stdlib_module_names}}
    assert not outside  # the standard library and the protocol's own modules, nothing else

"""Property-based: whatever the bytes, `decode` raises nothing but `ProtocolError`, refuses non-standard JSON
and out-of-range numbers, and every valid message survives encode -> decode."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perseus_client import protocol as p

from tests.support.frames import V, frames, regression_frames, valid_bodies

GPU = "GPU-0"


def _decode_or_error(data: bytes) -> p.Frame | p.ProtocolError:
    try:
        return p.decode(data)
    except p.ProtocolError as exc:
        return exc


@settings(max_examples=400, deadline=None)
@given(frames(GPU))
def test_decode_raises_only_protocol_error(data: bytes) -> None:
    outcome = _decode_or_error(data)
    if isinstance(outcome, p.ProtocolError):
        assert outcome.code in set(p.ErrorCode)
        assert 0 <= outcome.request_id < 2**63
        p.encode(p.ErrorReply(code=outcome.code.value, message=outcome.message), outcome.request_id)
    else:
        p.encode(outcome.message, outcome.request_id)  # anything accepted encodes back as standard JSON


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_escape(data: bytes) -> None:
    assert isinstance(_decode_or_error(data), p.Frame | p.ProtocolError)


@pytest.mark.parametrize("name", sorted(regression_frames(GPU)))
def test_regression_frames_decode_to_protocol_errors(name: str) -> None:
    outcome = _decode_or_error(regression_frames(GPU)[name])
    handlers_refuse = (
        "negative_stage_event",
        "negative_timestamp_event",
        "set_clock_far_above",
        "pipeline_2_62",
        "huge_stage_profile",
    )
    if name in handlers_refuse:
        assert isinstance(outcome, p.Frame)  # well-formed: the daemon's handlers refuse these
    else:
        assert isinstance(outcome, p.ProtocolError), outcome


def test_valid_bodies_round_trip() -> None:
    for body in valid_bodies(GPU):
        frame = p.decode(json.dumps({"v": p.PROTOCOL_VERSION, "id": 5, **body}).encode())
        assert p.decode(p.encode(frame.message, 5, 0)) == frame
        assert p.decode(p.encode(frame.message, 5)).message == frame.message


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('"target":NaN', p.ErrorCode.BAD_FRAME),
        ('"target":Infinity', p.ErrorCode.BAD_FRAME),
        ('"target":-Infinity', p.ErrorCode.BAD_FRAME),
        ('"target":1e999', p.ErrorCode.BAD_FIELD),
    ],
)
def test_non_finite_numbers_refused(text: str, code: p.ErrorCode) -> None:
    data = (V.decode() + '"id":12,"type":"set_policy","job":"j","policy":"time",' + text + "}").encode()
    with pytest.raises(p.ProtocolError) as refused:
        p.decode(data)
    assert refused.value.code == code
    assert refused.value.request_id == 12


def test_deep_nesting_is_bad_frame_with_the_id_when_readable() -> None:
    with pytest.raises(p.ProtocolError) as deep:
        p.decode(V + b'"id":33,"type":"status","x":' + b"[" * 100_000)
    assert deep.value.code == p.ErrorCode.BAD_FRAME
    assert deep.value.request_id == 33
    with pytest.raises(p.ProtocolError) as too_large:
        p.decode(V + b'"id":34,' + b" " * 100, max_frame_bytes=50)
    assert too_large.value.code == p.ErrorCode.TOO_LARGE
    assert too_large.value.request_id == 34


def test_encode_refuses_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        p.encode(p.SetPolicy(job="j", policy="time", target=float("nan")), 1)


def test_integers_beyond_64_bits_refused() -> None:
    body = {"type": "set_clock", "gpu": GPU, "sm_clock_mhz": 2**63}
    with pytest.raises(p.ProtocolError) as refused:
        p.decode(json.dumps({"v": p.PROTOCOL_VERSION, "id": 1, **body}).encode())
    assert refused.value.code == p.ErrorCode.BAD_FIELD
    assert "64 bits" in refused.value.message

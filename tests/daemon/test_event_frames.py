"""The event socket's fast decoding (`perseusd.daemon.event_frames`) is the generic decoding, only cheaper:
every frame the client library writes takes the fast path, and on any frame, valid or not, the result (or
the error's code and message) is exactly what `perseus_client.protocol.decode` gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perseus_client.event_frames import EventWriter  # the client's own wire forms
from perseus_client.protocol import (
    PROTOCOL_MINOR,
    ComputationBegin,
    Instruction,
    Message,
    ProtocolError,
    StepEnd,
    decode,
)

from perseusd.daemon.event_frames import _fast, decode_event

GPU = "GPU-6f1d2c9a-0000-4000-8000-000000000001"
WRITER = EventWriter()
MAX_FRAME_BYTES = 1 << 20


def computation(kind: bytes = b"comp_begin", instruction: bytes = b"forward", *values: int) -> bytes:
    stage, microbatch, chunk, timestamp_ns = values or (1, 7, 0, 123_456_789_012)
    return WRITER.computation(kind, GPU, stage, instruction.decode(), microbatch, chunk, timestamp_ns)


def step(kind: bytes = b"step_end", number: int = 41, timestamp_ns: int = 99) -> bytes:
    return WRITER.step(kind, GPU, number, timestamp_ns)


def outcome(
    decoder: object, data: bytes, max_frame_bytes: int = MAX_FRAME_BYTES
) -> Message | tuple[str, str]:
    try:
        if decoder is decode:
            return decode(data, max_frame_bytes, PROTOCOL_MINOR).message
        return decode_event(data, max_frame_bytes, PROTOCOL_MINOR)
    except ProtocolError as exc:
        return (str(exc.code), exc.message)


def assert_same(data: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
    assert outcome(decode_event, data, max_frame_bytes) == outcome(decode, data, max_frame_bytes)


@pytest.mark.parametrize(
    "data",
    [
        computation(),
        computation(b"comp_end", b"backward", 0, 0, 3, 0),
        computation(b"comp_begin", b"forward", 999_999_999_999_999_999, 0, 0, 1),
        step(),
        step(b"step_begin", 0, 0),
    ],
)
def test_what_the_client_writes_takes_the_fast_path(data: bytes) -> None:
    fast = _fast(data)
    assert fast is not None
    assert fast == decode(data, MAX_FRAME_BYTES, PROTOCOL_MINOR).message


def test_the_fast_path_builds_the_messages_the_generic_path_builds() -> None:
    gpu = "GPU-6f1d2c9a-0000-4000-8000-000000000001"
    begin = decode_event(computation(), MAX_FRAME_BYTES, PROTOCOL_MINOR)
    assert begin == ComputationBegin(gpu, 1, "forward", 7, 0, 123_456_789_012)
    assert isinstance(begin, ComputationBegin)
    assert begin.instruction is Instruction.FORWARD
    assert decode_event(step(), MAX_FRAME_BYTES, PROTOCOL_MINOR) == StepEnd(gpu, 41, 99)


@pytest.mark.parametrize(
    "data", [computation(), computation(b"comp_end"), step(b"step_begin"), step(b"step_end")]
)
def test_the_fast_path_fills_the_fields_as_init_would(data: bytes) -> None:
    """The fast path sets an event's fields without calling its `__init__` (about 3 us a frozen dataclass
    takes): that is the message `__init__` builds only while the dataclass does nothing else."""
    fast = _fast(data)
    generic = decode(data, MAX_FRAME_BYTES, PROTOCOL_MINOR).message
    assert type(fast) is type(generic)
    assert vars(fast) == vars(generic)
    for cls in type(generic).__mro__[:-1]:
        assert "__post_init__" not in vars(cls), cls
        assert "__slots__" not in vars(cls), cls


@pytest.mark.parametrize("instruction", [i.value.encode() for i in Instruction])
def test_every_instruction_takes_the_fast_path(instruction: bytes) -> None:
    data = computation(b"comp_end", instruction)
    fast = _fast(data)
    assert fast is not None
    assert fast == decode(data, MAX_FRAME_BYTES, PROTOCOL_MINOR).message


def test_a_daemon_set_to_an_older_minor_refuses_the_split_backward_as_that_minor_would() -> None:
    data = computation(b"comp_begin", b"backward_weight")
    with pytest.raises(ProtocolError) as fast:
        decode_event(data, MAX_FRAME_BYTES, 7)
    with pytest.raises(ProtocolError) as generic:
        decode(data, MAX_FRAME_BYTES, 7)
    assert (fast.value.code, fast.value.message) == (generic.value.code, generic.value.message)
    assert "expected one of ['forward', 'backward']" in fast.value.message
    assert (
        decode_event(computation(), MAX_FRAME_BYTES, 7) == decode(computation(), MAX_FRAME_BYTES, 7).message
    )


@pytest.mark.parametrize(
    "data",
    [
        computation(b"comp_begin", b"forward", -1, 0, 0, 5),  # negative: decoded, the tracker refuses it
        computation(b"comp_begin", b"forward", 1, 2, 3, 9_223_372_036_854_775_807),  # 19 digits, in range
        computation(b"comp_begin", b"forward", 1, 2, 3, 9_223_372_036_854_775_808),  # over 64 bits
        computation().replace(b'"stage":1', b'"stage":01'),  # leading zero: not JSON
        computation().replace(b'"stage":1', b'"stage":1.0'),
        computation().replace(b'"stage":1', b'"stage":true'),
        computation().replace(b"forward", b"sideways"),
        computation().replace(b'"id":0', b'"id":5'),
        computation().replace(b'"id":0', b'"id":0,"m":3'),
        computation().replace(b'"id":0', b'"id":0,"m":99'),
        computation().replace(b'"v":6', b'"v":5'),
        computation().replace(b'"chunk":0', b'"chunk":0,"extra":1'),
        computation().replace(b'"chunk":0,', b""),
        computation().replace(b"GPU-6f1d", b"GPU-\\u0041"),  # an escape: same string either way
        computation().replace(b"GPU-6f1d", b"GPU-\x01"),  # a raw control character: not JSON
        computation().replace(b"GPU-6f1d", b"GPU-\xc3\xa9"),  # UTF-8: taken as it is
        computation().replace(b"GPU-6f1d", b"GPU-\xff"),  # not UTF-8
        computation().replace(b"timestamp_ns", b"timestamp_ns", 1) + b" ",
        b" " + computation(),
        computation()[:-1],
        computation().replace(b'"stage":1', b'"stage":NaN'),
        computation().replace(b"comp_begin", b"status"),
        step().replace(b'"step":41', b'"step":-41'),
        step().replace(b'"step":41', b'"step":41,"step":42'),
        step(b"step_middle"),
        b"",
        b"[]",
    ],
)
def test_any_other_frame_gets_what_the_generic_path_gives(data: bytes) -> None:
    assert_same(data)


def test_a_frame_over_the_limit_is_too_large_on_either_path() -> None:
    data = computation()
    assert_same(data, max_frame_bytes=len(data) - 1)
    assert outcome(decode_event, data, len(data) - 1)[0] == "TOO_LARGE"  # type: ignore[index]


@settings(max_examples=400, deadline=None)
@given(
    base=st.sampled_from([computation(), computation(b"comp_end", b"backward"), step(), step(b"step_begin")]),
    at=st.integers(min_value=0, max_value=200),
    replacement=st.binary(min_size=0, max_size=3),
)
def test_mutated_frames_decode_alike(base: bytes, at: int, replacement: bytes) -> None:
    at = min(at, len(base))
    assert_same(base[:at] + replacement + base[at + 1 :])

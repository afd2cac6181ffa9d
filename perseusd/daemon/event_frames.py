"""Decoding event frames cheaply: the hot path of the event socket (no transport here).

Every computation and step boundary of every training process is one event frame, so the daemon's CPU per
event is what a training job pays for the integration when the daemon shares its cores (docs/pytorch.md,
"Cost"). The client library writes events in one fixed form (`perseus_client.event_frames`: minor 0,
request id 0, fields in order, no whitespace); a frame in exactly that form, with values the generic
validation would accept as they are, is read by one regular expression instead of the JSON parser and the
schema walk. Anything else (another field order, whitespace, escapes in a string, a negative or very large
number, leading zeros, a frame over the size limit, any other type) goes through `perseus_client.protocol.
decode`, so the result, and every error with its code and message, is the same as before: the fast path
only ever accepts frames the generic path decodes to an equal message.
"""

from __future__ import annotations

import re

from perseus_client.message import VALUE_SINCE
from perseus_client.protocol import (
    PROTOCOL_MAJOR,
    ComputationBegin,
    ComputationEnd,
    Instruction,
    Message,
    StepBegin,
    StepEnd,
    decode,
)

_NUMBER = rb"(0|[1-9][0-9]{0,17})"
"""A JSON integer the generic path takes as it is: no sign, no leading zero, below 2^63 (18 digits)."""
_STRING = rb'"([^"\\\x00-\x1f]*)"'
"""A JSON string without escapes and without the control characters JSON refuses (UTF-8 checked apart)."""
_HEAD = rb'\{"v":%d,"id":0,"type":"' % PROTOCOL_MAJOR
_COMPUTATION = re.compile(
    _HEAD
    + rb'comp_(begin|end)","gpu":'
    + _STRING
    + rb',"stage":'
    + _NUMBER
    + rb',"instruction":"([a-z_]{1,20})","microbatch":'
    + _NUMBER
    + rb',"chunk":'
    + _NUMBER
    + rb',"timestamp_ns":'
    + _NUMBER
    + rb"\}"
)
_STEP = re.compile(
    _HEAD
    + rb'step_(begin|end)","gpu":'
    + _STRING
    + rb',"step":'
    + _NUMBER
    + rb',"timestamp_ns":'
    + _NUMBER
    + rb"\}"
)

_new = object.__new__
"""Event messages are built without their dataclass `__init__` (a frozen dataclass sets each field through
`object.__setattr__`: about 3 us of the daemon's CPU per event) by filling the instance's attributes at once;
they have no `__post_init__`, so the message is the one `__init__` would build (`tests/daemon/
test_event_frames.py` compares the two paths' messages)."""

_INSTRUCTIONS = {i.value.encode(): i for i in Instruction}
"""Every instruction by its wire bytes (a daemon set to an older minor reads fewer: `_known_at`)."""
_NEWEST_INSTRUCTION_SINCE = max(VALUE_SINCE.get(i.value, 0) for i in Instruction)


def decode_event(data: bytes, max_frame_bytes: int, minor: int) -> Message:
    """The message of one frame read on the event socket; raises `ProtocolError` as `decode` does.

    `minor` is the newest minor the daemon speaks (events exist since minor 0, so every minor reads them).
    The message may be of any type: the caller refuses what is not an event.
    """
    if len(data) <= max_frame_bytes:
        message = _fast(data, _INSTRUCTIONS if minor >= _NEWEST_INSTRUCTION_SINCE else _known_at(minor))
        if message is not None:
            return message
    return decode(data, max_frame_bytes, minor).message


def _known_at(minor: int) -> dict[bytes, Instruction]:
    """The instructions a daemon speaking `minor` reads (others go the generic path, which refuses them)."""
    return {k: i for k, i in _INSTRUCTIONS.items() if VALUE_SINCE.get(i.value, 0) <= minor}


def _fast(data: bytes, instructions: dict[bytes, Instruction] = _INSTRUCTIONS) -> Message | None:
    """The event of a frame in the client library's exact form, or None (then the generic path decides)."""
    try:
        match = _COMPUTATION.fullmatch(data)
        if match is not None:
            kind, gpu, stage, name, microbatch, chunk, timestamp_ns = match.groups()
            instruction = instructions.get(name)
            if instruction is None:
                return None
            computation = _new(ComputationBegin if kind == b"begin" else ComputationEnd)
            computation.__dict__.update(
                gpu=gpu.decode(),
                stage=int(stage),
                instruction=instruction,
                microbatch=int(microbatch),
                chunk=int(chunk),
                timestamp_ns=int(timestamp_ns),
            )
            return computation
        match = _STEP.fullmatch(data)
        if match is not None:
            kind, gpu, step, timestamp_ns = match.groups()
            step_event = _new(StepBegin if kind == b"begin" else StepEnd)
            step_event.__dict__.update(gpu=gpu.decode(), step=int(step), timestamp_ns=int(timestamp_ns))
            return step_event
    except UnicodeDecodeError:  # not UTF-8: the generic path names it
        return None
    return None

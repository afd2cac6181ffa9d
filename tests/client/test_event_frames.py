"""Events are encoded in one place (`perseus_client.event_frames`): what the client sends is what
`protocol.encode` writes for the same event, and both are what the generic envelope writer would write."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perseus_client import protocol as p
from perseus_client.envelope import MAX_REQUEST_ID, encode_frame
from perseus_client.event_frames import MAX_CACHED_GPUS, EventWriter, frame_head

INT64 = st.integers(min_value=0, max_value=(1 << 63) - 1)
GPUS = st.text(max_size=40)
INSTRUCTIONS = st.sampled_from(["forward", "backward"])
COMPUTATIONS = st.builds(
    lambda cls, *fields: cls(*fields),
    st.sampled_from([p.ComputationBegin, p.ComputationEnd]),
    GPUS,
    INT64,
    INSTRUCTIONS,
    INT64,
    INT64,
    INT64,
)
STEPS = st.builds(
    lambda cls, *fields: cls(*fields), st.sampled_from([p.StepBegin, p.StepEnd]), GPUS, INT64, INT64
)


@settings(max_examples=300, deadline=None)
@given(
    event=st.one_of(COMPUTATIONS, STEPS),
    request_id=st.integers(min_value=0, max_value=MAX_REQUEST_ID),
    minor=st.integers(min_value=0, max_value=p.PROTOCOL_MINOR),
)
def test_encode_writes_events_as_the_generic_writer_would(
    event: p.Message, request_id: int, minor: int
) -> None:
    data = p.encode(event, request_id, minor)
    assert data == encode_frame(event, request_id, minor)
    assert p.decode(data).message == event


@settings(max_examples=200, deadline=None)
@given(event=st.one_of(COMPUTATIONS, STEPS))
def test_the_client_sends_what_encode_writes(event: p.Message) -> None:
    writer = EventWriter()
    kind = event.TYPE.encode()
    if isinstance(event, p.StepBegin | p.StepEnd):
        sent = writer.step(kind, event.gpu, event.step, event.timestamp_ns)
    else:
        assert isinstance(event, p.ComputationBegin | p.ComputationEnd)
        sent = writer.computation(
            kind, event.gpu, event.stage, event.instruction, event.microbatch, event.chunk, event.timestamp_ns
        )
    assert sent == p.encode(event, 0, 0)


def test_the_head_is_the_envelopes() -> None:
    assert frame_head() == b'{"v":%d,"id":0,' % p.PROTOCOL_MAJOR
    assert json.loads(frame_head(6, 9, 3) + b'"type":"x"}') == {"v": 6, "id": 9, "m": 3, "type": "x"}


@pytest.mark.parametrize(
    "event",
    [
        p.ComputationBegin("GPU-a", 0, "sideways", 0, 0, 1),  # type: ignore[arg-type]
        p.ComputationEnd("GPU-a", True, "forward", 0, 0, 1),
        p.ComputationBegin("GPU-a", 0, "forward", 1.5, 0, 1),  # type: ignore[arg-type]
        p.StepBegin(None, 0, 1),  # type: ignore[arg-type]
        p.StepEnd("GPU-a", 0, "1"),  # type: ignore[arg-type]
    ],
)
def test_an_event_the_daemon_would_refuse_is_not_written(event: p.Message) -> None:
    with pytest.raises(ValueError, match=r"instruction|integers"):
        p.encode(event)


def test_the_writer_keeps_a_bounded_number_of_gpu_names() -> None:
    writer = EventWriter()
    for index in range(MAX_CACHED_GPUS + 5):
        data = writer.step(b"step_end", f"GPU-{index}", 1, 2)
        assert json.loads(data)["gpu"] == f"GPU-{index}"
    assert len(writer._gpu_json) <= MAX_CACHED_GPUS

"""`PerseusClient.announce_straggler` / `clear_straggler`: arguments the daemon would refuse are refused
here, before anything is sent; valid ones go out as the protocol's `announce_straggler` request (the
daemon's side is in tests/ctl/test_straggler_e2e.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from perseus_client import PerseusClient, PerseusClientError
from perseus_client.protocol import (
    CONTROL_SOCKET_NAME,
    PROTOCOL_VERSION,
    AnnounceStraggler,
    AnnounceStragglerOk,
    HelloOk,
    Message,
    decode,
    encode,
)

from tests.support.stub_daemon import StubDaemon

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def unconnected(tmp_path: Path) -> PerseusClient:
    """A client with no sockets: any call that got past validation fails with NOT_CONNECTED."""
    return PerseusClient(tmp_path, job="j1", connect=False, strict=True)


@pytest.mark.parametrize(
    ("pipeline", "factor", "needle"),
    [
        (-1, 1.2, "pipeline must be an integer >= 0"),
        (True, 1.2, "pipeline must be an integer >= 0"),
        (1.0, 1.2, "pipeline must be an integer >= 0"),
        (0, 0.99, "factor must be a number >= 1"),
        (0, -2, "factor must be a number >= 1"),
        (0, math.nan, "factor must be a number >= 1"),
        (0, math.inf, "factor must be finite"),
        (0, True, "factor must be a number >= 1"),
        (0, "1.2", "factor must be a number >= 1"),
    ],
)
def test_announce_rejects_bad_arguments_locally(
    unconnected: PerseusClient, pipeline: object, factor: object, needle: str
) -> None:
    with pytest.raises(ValueError, match=needle):
        unconnected.announce_straggler(pipeline, factor)  # type: ignore[arg-type]


def test_clear_rejects_a_bad_pipeline_locally(unconnected: PerseusClient) -> None:
    with pytest.raises(ValueError, match="pipeline must be an integer >= 0"):
        unconnected.clear_straggler(-3)


@pytest.mark.parametrize("factor", [1, 1.0, 1.2, 3])
def test_valid_arguments_reach_the_transport(unconnected: PerseusClient, factor: float) -> None:
    with pytest.raises(PerseusClientError) as info:
        unconnected.announce_straggler(7, factor)
    assert info.value.code == "NOT_CONNECTED"
    with pytest.raises(PerseusClientError) as info:
        unconnected.clear_straggler(0, job="other")
    assert info.value.code == "NOT_CONNECTED"


class _Announcements:
    """Answers hello and records every announcement (the real codec): what the client puts on the wire,
    without the daemon's job logic."""

    def __init__(self) -> None:
        self.received: list[AnnounceStraggler] = []

    def answer(self, request: bytes) -> bytes:
        frame = decode(request)
        return encode(self._reply_to(frame.message), frame.request_id)

    def _reply_to(self, message: Message) -> Message:
        if isinstance(message, AnnounceStraggler):
            self.received.append(message)
            return AnnounceStragglerOk(message.job, message.pipeline, message.factor, message.clear, True)
        return HelloOk(daemon_version="stub", protocol=PROTOCOL_VERSION, gpus=())


def test_announce_and_clear_put_the_right_request_on_the_wire(tmp_path: Path) -> None:
    announcements = _Announcements()
    stub = StubDaemon(tmp_path / CONTROL_SOCKET_NAME, announcements.answer)
    try:
        with PerseusClient(tmp_path, job="j1", timeout_s=10.0) as client:
            reply = client.announce_straggler(2, 3)
            assert (reply.job, reply.pipeline, reply.factor, reply.clear, reply.shared) == (
                "j1",
                2,
                3.0,
                False,
                True,
            )
            assert client.clear_straggler(0, job="other").clear
    finally:
        stub.close()
    assert announcements.received == [
        AnnounceStraggler(job="j1", pipeline=2, factor=3.0, clear=False),
        AnnounceStraggler(job="other", pipeline=0, factor=1.0, clear=True),
    ]
    assert type(announcements.received[0].factor) is float

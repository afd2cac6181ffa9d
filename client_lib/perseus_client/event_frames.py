"""Event frames, written: the one encoder of the four event messages (stdlib only).

Every computation and step boundary of a training process is one event frame, so events are written by
formatting bytes behind a fixed envelope head, not through a dataclass and the JSON encoder. The client
writes every event here (minor 0, request id 0: every daemon of the major reads them, and they stay short),
and `perseus_client.protocol.encode` writes event messages here too, so an event's bytes are made in one
place. The frames are exactly what `envelope.encode_frame` would write for the same message (fields in
declaration order, no whitespace); the daemon's fast reader (`perseusd.daemon.event_frames`) takes this form.
"""

from __future__ import annotations

import json

from perseus_client.message import Instruction
from perseus_client.version import PROTOCOL_MAJOR

INSTRUCTIONS = {i.value: i.value.encode() for i in Instruction}
"""The instructions a computation event may name (`message.Instruction`'s values), as written."""
COMPUTATION_KINDS = (b"comp_begin", b"comp_end")
STEP_KINDS = (b"step_begin", b"step_end")
MAX_CACHED_GPUS = 1024
"""GPU names whose JSON form is kept (a process names a few; the bound only guards against misuse)."""


def frame_head(major: int = PROTOCOL_MAJOR, request_id: int = 0, minor: int = 0) -> bytes:
    """The envelope before the type, as `envelope.encode_frame` writes it ("m" left out for minor 0)."""
    head = b'{"v":%d,"id":%d,' % (major, request_id)
    return head + b'"m":%d,' % minor if minor > 0 else head


class EventWriter:
    """Writes event frames behind one envelope head (default: the client's, minor 0 and request id 0).

    A GPU's UUID, which every event repeats, is JSON-encoded once. Numbers are written as given (`%d`): the
    client passes what training code gave it, and `protocol.encode` checks the values before it writes.
    """

    __slots__ = ("_computation", "_gpu_json", "_step")

    def __init__(self, head: bytes | None = None) -> None:
        head = frame_head() if head is None else head
        self._computation = head + (
            b'"type":"%s","gpu":%s,"stage":%d,"instruction":"%s","microbatch":%d,"chunk":%d,"timestamp_ns":%d}'
        )
        self._step = head + b'"type":"%s","gpu":%s,"step":%d,"timestamp_ns":%d}'
        self._gpu_json: dict[str, bytes] = {}

    def computation(
        self,
        kind: bytes,
        gpu: str,
        stage: int,
        instruction: str,
        microbatch: int,
        chunk: int,
        timestamp_ns: int,
    ) -> bytes:
        """A computation's begin or end (`kind`: b"comp_begin" or b"comp_end"); ValueError for an
        instruction that is not an `Instruction`'s value."""
        written = INSTRUCTIONS.get(instruction)
        if written is None:
            raise ValueError(f"instruction must be one of {sorted(INSTRUCTIONS)} (got {instruction!r})")
        gpu_json = self._gpu_json.get(gpu) or self._remember(gpu)
        return self._computation % (kind, gpu_json, stage, written, microbatch, chunk, timestamp_ns)

    def step(self, kind: bytes, gpu: str, step: int, timestamp_ns: int) -> bytes:
        """A step's begin or end (`kind`: b"step_begin" or b"step_end")."""
        gpu_json = self._gpu_json.get(gpu) or self._remember(gpu)
        return self._step % (kind, gpu_json, step, timestamp_ns)

    def _remember(self, gpu: str) -> bytes:
        if len(self._gpu_json) >= MAX_CACHED_GPUS:
            self._gpu_json.clear()
        encoded = self._gpu_json[gpu] = json.dumps(gpu).encode()
        return encoded

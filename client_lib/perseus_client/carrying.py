"""The client's side of carried events (protocol 6.11; stdlib only): hold what may wait, send it later.

The daemon says, per GPU, which computation begins and ends it only records (`carry_messages.Carry`). Such a
frame is held here and sent in one datagram with the next frame sent at once (frames one a line, in the order
they were made), so a plan's events wake the daemon about half as often. A held frame never waits longer
than `MAX_HOLD_NS` nor behind more than `MAX_HELD` others: the next event after that goes at once with them.
Every step boundary is sent at once, so nothing is held across a step's end.
"""

from __future__ import annotations

import threading

from perseus_client.carry_messages import CarriedComputation, Carry
from perseus_client.message import Instruction

MAX_HELD = 64
"""Frames held at most; the next event is sent at once with them."""
MAX_HELD_BYTES = 16 * 1024
"""Bytes held at most (an event frame is about 200 bytes; the daemon reads datagrams of up to 64 KiB)."""
MAX_HOLD_NS = 200_000_000
"""The longest a frame is held: the daemon trusts an event's timestamp for a second after it was made."""
SEPARATOR = b"\n"
"""Between the frames of one datagram (a JSON frame has no raw newline)."""

_Key = tuple[str, int, int]  # (instruction, microbatch, chunk)


class Carrier:
    """The carried events of this client's GPUs and the frames held now (thread-safe)."""

    __slots__ = ("_begins", "_bytes", "_ends", "_held", "_lock", "_since_ns", "carried")

    def __init__(self) -> None:
        self._begins: dict[str, frozenset[_Key]] = {}
        self._ends: dict[str, frozenset[_Key]] = {}
        self._held: list[bytes] = []
        self._bytes = 0
        self._since_ns = 0
        self._lock = threading.Lock()
        self.carried = 0
        """Events carried: held, then passed on in one datagram with others (where that datagram could not be
        sent, they are counted in the client's `events_dropped` too)."""

    def update(self, message: Carry) -> None:
        """What the daemon said of one GPU (replaces what it said before)."""
        begins = frozenset(_key(c) for c in message.computations if c.begin)
        ends = frozenset(_key(c) for c in message.computations if c.end)
        _store(self._begins, message.gpu, begins)
        _store(self._ends, message.gpu, ends)

    def reset(self) -> int:
        """Forget every GPU's carried events (a new session) and drop what is held: how many frames."""
        self._begins, self._ends = {}, {}
        return len(self.take())

    def hold(self, begin: bool, gpu: str, key: _Key, frame: bytes, now_ns: int) -> bool:
        """Hold `frame` (True) when its event may be carried and the limits allow; False: send it now."""
        carried = (self._begins if begin else self._ends).get(gpu)
        if carried is None or key not in carried:
            return False
        with self._lock:
            held = self._held
            if held and (
                len(held) >= MAX_HELD
                or now_ns - self._since_ns > MAX_HOLD_NS
                or self._bytes + len(frame) > MAX_HELD_BYTES
            ):
                return False
            if not held:
                self._since_ns = now_ns
            held.append(frame)
            self._bytes += len(frame)
            return True

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def take(self) -> list[bytes]:
        """The frames held, in order, and hold none."""
        with self._lock:
            held, self._held, self._bytes = self._held, [], 0
        return held

    def join(self, frame: bytes | None = None) -> tuple[bytes, int]:
        """One datagram of the frames held and `frame` after them (None: the held ones alone), and how many
        frames it holds; hold none from now."""
        held = self.take()
        self.carried += len(held)
        if frame is not None:
            held.append(frame)
        return SEPARATOR.join(held), len(held)


def _key(computation: CarriedComputation) -> _Key:
    """As the event methods name it: the instruction's value (an `Instruction` hashes by its name)."""
    instruction = computation.instruction
    value = instruction.value if isinstance(instruction, Instruction) else str(instruction)
    return (value, computation.microbatch, computation.chunk)


def _store(table: dict[str, frozenset[_Key]], gpu: str, keys: frozenset[_Key]) -> None:
    if keys:
        table[gpu] = keys
    else:
        table.pop(gpu, None)

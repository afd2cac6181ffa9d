"""Carried events (protocol 6.11): which of a GPU's computation events may wait for the next one sent.

The daemon acts on some events as they come (an end that changes the next computation's clock, a begin that
schedules an early raise or lowering, every step boundary) and only records the others, from their
timestamps. Under a running plan it tells the client, on the SOCK_SEQPACKET event connection, which begins and
ends are of the second kind (`Carry`); the client then holds those frames and sends them in one datagram with
the next event it sends at once, so the daemon wakes once for several events. Nothing is reordered and no
event is lost for it: a held frame goes with the next immediate one, and every step end is immediate.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import GpuMessage, Instruction, Message


@dataclass(frozen=True)
class CarriedComputation:
    """One computation of a GPU's plan whose `begin` and/or `end` event may be carried."""

    instruction: Instruction
    microbatch: int
    chunk: int
    begin: bool
    end: bool


@dataclass(frozen=True)
class CarryReady(Message, wire_type="carry_ready", since=11):
    """Event socket, client -> daemon, the first frame of a connection: this client reads `carry` frames on
    it and may send several event frames in one datagram. The daemon answers with a `carry` frame for each
    GPU the process holds. Not an event: never counted as one."""


@dataclass(frozen=True)
class Carry(GpuMessage, wire_type="carry", since=11):
    """Event socket, daemon -> client (one that sent `carry_ready`): the events of `gpu` that may be carried
    from now on; empty: none (every event is sent at once). Replaces what the last one said."""

    computations: tuple[CarriedComputation, ...]

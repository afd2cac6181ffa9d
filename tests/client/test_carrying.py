"""The client's carried events: held only where the daemon allows, in order, within the limits."""

from __future__ import annotations

from perseus_client.carrying import MAX_HELD, MAX_HOLD_NS, SEPARATOR, Carrier
from perseus_client.protocol import CarriedComputation, Carry, Instruction

GPU = "GPU-0"


def _carrier(*computations: CarriedComputation) -> Carrier:
    carrier = Carrier()
    carrier.update(Carry(gpu=GPU, computations=computations))
    return carrier


def test_only_the_events_the_daemon_named_are_held() -> None:
    carrier = _carrier(CarriedComputation(Instruction.FORWARD, 1, 0, begin=True, end=False))
    assert carrier.hold(True, GPU, ("forward", 1, 0), b"b1", 0)
    assert not carrier.hold(False, GPU, ("forward", 1, 0), b"e1", 0)  # its end is not carried
    assert not carrier.hold(True, GPU, ("forward", 2, 0), b"b2", 0)
    assert not carrier.hold(True, "GPU-1", ("forward", 1, 0), b"x", 0)
    assert carrier.join(b"e1") == (b"b1" + SEPARATOR + b"e1", 2)
    assert carrier.carried == 1
    assert not carrier.holding


def test_limits_send_the_next_event_at_once() -> None:
    carrier = _carrier(*(CarriedComputation(Instruction.FORWARD, mb, 0, True, True) for mb in range(200)))
    for mb in range(MAX_HELD):
        assert carrier.hold(True, GPU, ("forward", mb, 0), b"f", 1)
    assert not carrier.hold(True, GPU, ("forward", MAX_HELD, 0), b"f", 1)  # as many as may be held
    carrier.take()
    assert carrier.hold(True, GPU, ("forward", 0, 0), b"f", 10)
    assert not carrier.hold(False, GPU, ("forward", 0, 0), b"f", 11 + MAX_HOLD_NS)  # held too long


def test_an_empty_carry_and_a_new_session_stop_carrying() -> None:
    carrier = _carrier(CarriedComputation(Instruction.BACKWARD, 0, 0, True, True))
    assert carrier.hold(True, GPU, ("backward", 0, 0), b"b", 0)
    assert carrier.reset() == 1  # the frame held is dropped (the caller counts it)
    assert not carrier.hold(True, GPU, ("backward", 0, 0), b"b", 0)
    carrier.update(Carry(gpu=GPU, computations=(CarriedComputation(Instruction.BACKWARD, 0, 0, True, True),)))
    carrier.update(Carry(gpu=GPU, computations=()))
    assert not carrier.hold(True, GPU, ("backward", 0, 0), b"b", 0)

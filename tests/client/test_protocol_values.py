"""New values of existing fields (the zero-bubble schedules and their split backward, protocol 6.8) are read
by a daemon of their minor and refused, as unknown, by one set to speak an older minor."""

from __future__ import annotations

import pytest
from perseus_client.message import VALUE_SINCE
from perseus_client.protocol import (
    PROTOCOL_MINOR,
    ComputationEnd,
    ErrorCode,
    Instruction,
    Message,
    PlanEntry,
    ProtocolError,
    Register,
    SetPlan,
    decode,
    encode,
)

GPU = "GPU-6f1d2c9a-0000-4000-8000-000000000001"
SPLIT = (
    Register(GPU, "job", 0, 0, 4, 8, "zbv", 2),
    Register(GPU, "job", 0, 0, 4, 8, "interleaved_zb", 2),
    ComputationEnd(GPU, 0, Instruction.BACKWARD_WEIGHT, 3, 1, 99),
    SetPlan(
        GPU, (PlanEntry(Instruction.FORWARD, 0, 0, 1410), PlanEntry(Instruction.BACKWARD_INPUT, 0, 0, 1200))
    ),
)


def test_the_new_values_are_of_the_current_minor() -> None:
    assert set(VALUE_SINCE.values()) <= set(range(PROTOCOL_MINOR + 1))
    assert {"backward_input", "backward_weight", "interleaved_zb", "zbv"} <= set(VALUE_SINCE)


@pytest.mark.parametrize("message", SPLIT, ids=lambda m: m.TYPE)
def test_a_daemon_of_minor_8_reads_them(message: Message) -> None:
    assert decode(encode(message), minor=8).message == message


@pytest.mark.parametrize("message", SPLIT, ids=lambda m: m.TYPE)
def test_a_daemon_set_to_minor_7_refuses_them_as_unknown_values(message: Message) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(encode(message, minor=7), minor=7)
    assert refused.value.code is ErrorCode.BAD_FIELD
    assert "expected one of" in refused.value.message


def test_decoded_instructions_are_the_one_instruction_type() -> None:
    message = decode(encode(ComputationEnd(GPU, 0, Instruction.BACKWARD_INPUT, 3, 1, 99))).message
    assert isinstance(message, ComputationEnd)
    assert message.instruction is Instruction.BACKWARD_INPUT
    assert message.instruction == "backward_input"
    assert f"{message.instruction}" == "backward_input"
